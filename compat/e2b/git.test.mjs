// E2B SDK conformance for sandbox.git: the real e2b@2.51.0 Git module
// (clone, init, status, branches, add, commit, push, pull,
// dangerouslyAuthenticate) against a git smart-HTTP server this process
// runs on loopback: git's own `git http-backend` as a CGI behind a node
// HTTP server that demands Basic auth. The sandbox reaches it as
// git.test:<port> (run.sh allows *.test and maps it to 127.0.0.1). The last
// step is cella's safer way: the credential is a cella secret that the
// egress proxy adds as a header for git.test only, and never enters the
// sandbox.
import { describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { step, rejects, sandboxJanitor, closeProxy, DAEMON_URL, ADMIN_KEY } from './lib/harness.mjs'

const e2b = await import('e2b-2.51.0')
const { Sandbox, Secret, GitAuthError } = e2b

const USER = 'git-user'
const PASS = `s3cret-${Math.random().toString(36).slice(2, 10)}`
const BASIC = Buffer.from(`${USER}:${PASS}`).toString('base64')
const RUN = `r${Date.now().toString(36)}`
const SECRET = `GIT_BASIC_${RUN}`

const root = mkdtempSync(join(tmpdir(), 'cella-git-compat-'))
const bare = join(root, 'repo.git')
const gitHost = (...args) => execFileSync('git', args, { encoding: 'utf8', env: { ...process.env, GIT_CONFIG_NOSYSTEM: '1', HOME: root } })

// The git server: every request needs Basic auth; the rest is git's.
let port
const pushes = [] // REMOTE_USER of each receive-pack
const server = http.createServer((req, res) => {
  if (req.headers.authorization !== `Basic ${BASIC}`) {
    req.resume()
    res.writeHead(401, { 'WWW-Authenticate': 'Basic realm="cella-compat"', 'Content-Type': 'text/plain' })
    res.end('authentication required\n')
    return
  }
  const u = new URL(req.url, 'http://x')
  if (u.pathname.endsWith('/git-receive-pack')) pushes.push(USER)
  const cgi = spawn('git', ['http-backend'], {
    env: {
      PATH: process.env.PATH,
      GIT_PROJECT_ROOT: root,
      GIT_HTTP_EXPORT_ALL: '1',
      REMOTE_USER: USER, // enables receive-pack
      REMOTE_ADDR: '127.0.0.1',
      REQUEST_METHOD: req.method,
      PATH_INFO: decodeURIComponent(u.pathname),
      QUERY_STRING: u.search.slice(1),
      CONTENT_TYPE: req.headers['content-type'] || '',
      HTTP_CONTENT_ENCODING: req.headers['content-encoding'] || '',
      GIT_PROTOCOL: req.headers['git-protocol'] || '',
    },
  })
  req.pipe(cgi.stdin)
  let head = Buffer.alloc(0)
  let headersDone = false
  cgi.stdout.on('data', (chunk) => {
    if (headersDone) { res.write(chunk); return }
    head = Buffer.concat([head, chunk])
    const end = head.indexOf('\r\n\r\n')
    if (end < 0) return
    headersDone = true
    let status = 200
    const headers = {}
    for (const line of head.subarray(0, end).toString().split('\r\n')) {
      const i = line.indexOf(':')
      const k = line.slice(0, i).trim()
      const v = line.slice(i + 1).trim()
      if (k.toLowerCase() === 'status') status = parseInt(v, 10)
      else headers[k] = v
    }
    res.writeHead(status, headers)
    res.write(head.subarray(end + 4))
  })
  cgi.on('close', () => res.end())
  cgi.on('error', () => { res.writeHead(500); res.end() })
})

before(async () => {
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  port = server.address().port
  // The upstream repository: main with one commit.
  gitHost('init', '--bare', '--initial-branch=main', bare)
  const work = join(root, 'seed')
  gitHost('init', '--initial-branch=main', work)
  writeFileSync(join(work, 'README.md'), 'hello from the server\n')
  gitHost('-C', work, 'add', 'README.md')
  gitHost('-C', work, '-c', 'user.name=Seed', '-c', 'user.email=seed@example.test', 'commit', '-m', 'seed')
  gitHost('-C', work, 'push', bare, 'main')
})
after(() => {
  server.closeAllConnections()
  server.close()
  rmSync(root, { recursive: true, force: true })
})

describe('e2b@2.51.0 git', () => {
  const janitor = sandboxJanitor(Sandbox)
  let sbx
  const url = () => `http://git.test:${port}/repo.git`

  step('git.clone without credentials → GitAuthError; with username/password → cloned, status and branches', async ({ sdk }) => {
    sbx = janitor.track(await sdk('Sandbox.create', () => Sandbox.create({ timeoutMs: 240_000 })))
    const err = await rejects(sdk('git.clone (no credentials)', () => sbx.git.clone(url(), { path: '/home/user/anon', timeoutMs: 60_000 })), 'an unauthenticated clone')
    assert.ok(err instanceof GitAuthError, `${err?.name}: ${err?.message}`)
    await sdk('git.clone({username, password})', () => sbx.git.clone(url(), { path: '/home/user/repo', username: USER, password: PASS, timeoutMs: 60_000 }))
    assert.equal((await sbx.commands.run('cat /home/user/repo/README.md')).stdout, 'hello from the server\n')
    // The SDK puts the credentials in the URL for the clone only.
    assert.equal(await sbx.git.remoteGet('/home/user/repo', 'origin'), url())
    const st = await sdk('git.status', () => sbx.git.status('/home/user/repo'))
    assert.equal(st.currentBranch, 'main')
    assert.equal(st.upstream, 'origin/main')
    assert.equal(st.isClean, true)
    const br = await sdk('git.branches', () => sbx.git.branches('/home/user/repo'))
    assert.deepEqual(br, { branches: ['main'], currentBranch: 'main' })
  }, { timeout: 150_000 })

  step('add, commit, push with username/password → the server has the commit', async ({ sdk }) => {
    const repo = '/home/user/repo'
    await sbx.files.write(`${repo}/new.txt`, 'from the sandbox\n')
    const st = await sbx.git.status(repo)
    assert.equal(st.hasUntracked, true)
    assert.deepEqual(st.fileStatus.map((f) => [f.name, f.status]), [['new.txt', 'untracked']])
    await sdk('git.add({all})', () => sbx.git.add(repo, { all: true }))
    assert.equal((await sbx.git.status(repo)).stagedCount, 1)
    await sdk('git.commit', () => sbx.git.commit(repo, 'add new.txt', { authorName: 'Sandbox', authorEmail: 'sbx@example.test' }))
    const ahead = await sbx.git.status(repo)
    assert.equal(ahead.ahead, 1)
    await sdk('git.push({username, password})', () => sbx.git.push(repo, { username: USER, password: PASS, timeoutMs: 60_000 }))
    assert.equal(gitHost('--git-dir', bare, 'log', '-1', '--format=%s %an', 'main').trim(), 'add new.txt Sandbox')
    assert.equal((await sbx.git.status(repo)).ahead, 0)
    assert.ok(pushes.length >= 1)
  }, { timeout: 150_000 })

  step('git.init + remoteAdd + dangerouslyAuthenticate → push and pull with no per-call credentials', async ({ sdk }) => {
    const repo = '/home/user/fresh'
    await sdk('git.init', () => sbx.git.init(repo, { initialBranch: 'main' }))
    await sdk('git.configureUser', () => sbx.git.configureUser('Sandbox Two', 'two@example.test'))
    await sbx.git.remoteAdd(repo, 'origin', url())
    await sdk('git.dangerouslyAuthenticate', () => sbx.git.dangerouslyAuthenticate({ username: USER, password: PASS, host: `git.test:${port}`, protocol: 'http' }))
    await sbx.git.pull(repo, { remote: 'origin', branch: 'main', timeoutMs: 60_000 })
    assert.equal((await sbx.commands.run(`cat ${repo}/new.txt`)).stdout, 'from the sandbox\n')
    await sbx.git.createBranch(repo, 'feature')
    await sbx.files.write(`${repo}/feature.txt`, 'feature\n')
    await sbx.git.add(repo, { files: ['feature.txt'] })
    await sbx.git.commit(repo, 'feature work')
    await sdk('git.push({setUpstream})', () => sbx.git.push(repo, { remote: 'origin', branch: 'feature', setUpstream: true, timeoutMs: 60_000 }))
    assert.equal(gitHost('--git-dir', bare, 'log', '-1', '--format=%s %an', 'feature').trim(), 'feature work Sandbox Two')
    const br = await sbx.git.branches(repo)
    assert.deepEqual(br, { branches: ['feature', 'main'], currentBranch: 'feature' })
    // What "dangerously" means: the password now sits in the sandbox.
    assert.match((await sbx.commands.run('cat ~/.git-credentials')).stdout, new RegExp(PASS))
  }, { timeout: 150_000 })

  step("cella's way: the credential is a secret the egress proxy adds for git.test; it never enters the sandbox", async ({ sdk }) => {
    await sdk('Secret.create', () => Secret.create(SECRET, BASIC))
    try {
      // The SDK sends only E2B's `transform` of a rule; the binding to
      // plain http on the server's port is cella's (`scheme`, `port`), so
      // this create goes to the REST API, and the SDK connects to it.
      const res = await fetch(`${DAEMON_URL}/v2/sandboxes`, {
        method: 'POST',
        headers: { 'X-API-Key': ADMIN_KEY, 'Content-Type': 'application/json' },
        body: JSON.stringify({
          templateID: 'base',
          timeout: 120,
          network: { rules: { 'git.test': [{ transform: { headers: { Authorization: `Basic \${e2b.secrets.${SECRET}}` } }, scheme: 'http', port }] } },
        }),
      })
      assert.equal(res.status, 201, await res.clone().text())
      const safe = janitor.track(await sdk('Sandbox.connect', async () => Sandbox.connect((await res.json()).sandboxID)))
      await sdk('git.clone (no credentials)', () => safe.git.clone(url(), { path: '/home/user/repo', timeoutMs: 60_000 }))
      assert.equal((await safe.commands.run('cat /home/user/repo/feature.txt 2>/dev/null || git -C /home/user/repo log -1 --format=%s')).stdout, 'add new.txt\n')
      const leak = await safe.commands.run(`(env; cat ~/.git-credentials ~/.gitconfig /home/user/repo/.git/config 2>/dev/null) | grep -c -e ${PASS} -e ${BASIC} || true`)
      assert.equal(leak.stdout.trim(), '0', 'the credential is nowhere in the sandbox')
    } finally {
      await Secret.destroy(SECRET).catch(() => {})
    }
  }, { timeout: 150_000 })
})

after(() => closeProxy())
