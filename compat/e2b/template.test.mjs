// E2B template build conformance: the real, unmodified e2b@2.51.0 Template
// class and @e2b/cli@2.19.0 against cella's build API and its build engine,
// following ../shared/e2b-template-api.md §9 (scenarios 1–10, 12, 14, 16).
// Run with ./run.sh, which starts a loopback registry holding the stand-in
// images (python:3.12-slim and debian:bookworm, made from the base
// template's layers) and points the daemon's docker.io mirror at it.
//
// Nothing leaves the machine: the build's apt and pip talk to a mirror this
// file serves on loopback (pkgs.test, mapped there by the daemon's
// --egress-resolve '*.test=127.0.0.1'), holding a .deb built here with
// dpkg-deb and two wheels made here. The stand-in image, like the real
// python:3.12-slim, has no iproute2 (waitForPort's `ss`) and Debian's python
// is python3: the .deb brings a small `ss` that answers waitForPort's query
// from /proc/net and a `python` link.
import { describe, it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import crypto from 'node:crypto'
import { execFileSync, spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { step, rejects, proxy, DAEMON_URL, ADMIN_KEY, closeProxy, matching, sandboxJanitor, sleep } from './lib/harness.mjs'

const e2b = await import('e2b-2.51.0')
const { Template, Sandbox, BuildError, FileUploadError, AuthenticationError, waitForPort, waitForURL } = e2b
const HERE = path.dirname(fileURLToPath(import.meta.url))
const CLI = path.join(HERE, 'node_modules/@e2b/cli-2.19.0/dist/index.js')

const RUN = `${Date.now().toString(36)}${crypto.randomBytes(2).toString('hex')}`
const ALIAS = `cella-demo-${RUN}`
const BUILD = 900_000 // one build on a loaded 2-core machine

// lineOf is the line of its caller: the SDK points a BuildError's stack at
// the builder call of the failing step.
function lineOf () { return Number(new Error().stack.split('\n')[2].match(/:(\d+):\d+\)?$/)[1]) }

// ---- the loopback package mirror -------------------------------------------
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'cella-e2b-template-'))
const served = { apt: 0, pip: 0 }
const files = new Map() // URL path → Buffer
const mirror = http.createServer((req, res) => {
  const body = files.get(path.posix.normalize(decodeURIComponent(req.url.split('?')[0]))) // apt asks for /apt/./Packages
  if (req.url.startsWith('/apt/')) served.apt++
  if (req.url.startsWith('/simple/') || req.url.startsWith('/files/')) served.pip++
  if (!body) { res.writeHead(404); res.end('not here'); return }
  res.writeHead(200, { 'Content-Length': body.length, 'Content-Type': req.url.startsWith('/simple/') ? 'text/html' : 'application/octet-stream' })
  res.end(req.method === 'HEAD' ? undefined : body)
})
await new Promise((resolve) => mirror.listen(0, '127.0.0.1', resolve))
const MIRROR = `http://pkgs.test:${mirror.address().port}`

function buildDeb () {
  const root = path.join(work, 'deb')
  fs.mkdirSync(path.join(root, 'DEBIAN'), { recursive: true })
  fs.mkdirSync(path.join(root, 'usr/local/bin'), { recursive: true })
  fs.writeFileSync(path.join(root, 'DEBIAN/control'), [
    'Package: cella-compat-tools', 'Version: 1.0', 'Architecture: all', 'Maintainer: cella tests <tests@cella.test>',
    'Description: what the python:3.12-slim stand-in lacks for the E2B suite', ' a python link and an ss that reads /proc/net', ''].join('\n'))
  fs.writeFileSync(path.join(root, 'usr/local/bin/ss'), `#!/usr/bin/python3
# ss stand-in: answers waitForPort's "ss -Htuln sport = :PORT" from /proc/net.
import sys
a = sys.argv[1:]
port = int(a[a.index('sport') + 2].lstrip(':')) if 'sport' in a else None
for f, listen in (('tcp', '0A'), ('tcp6', '0A'), ('udp', '07'), ('udp6', '07')):
    try:
        rows = open('/proc/net/' + f).read().splitlines()[1:]
    except OSError:
        continue
    for r in rows:
        p = r.split()
        if len(p) > 3 and p[3] == listen:
            lp = int(p[1].rsplit(':', 1)[1], 16)
            if port is None or lp == port:
                print('%s LISTEN 0 0 *:%d *:*' % (f, lp))
`, { mode: 0o755 })
  fs.symlinkSync('/usr/bin/python3', path.join(root, 'usr/local/bin/python'))
  const deb = path.join(work, 'cella-compat-tools_1.0_all.deb')
  execFileSync('dpkg-deb', ['--root-owner-group', '-Zgzip', '--build', root, deb], { stdio: 'pipe' })
  const data = fs.readFileSync(deb)
  files.set('/apt/cella-compat-tools_1.0_all.deb', data)
  const packages = Buffer.from(fs.readFileSync(path.join(root, 'DEBIAN/control'), 'utf8').trimEnd() + '\n' +
    `Filename: ./cella-compat-tools_1.0_all.deb\nSize: ${data.length}\nSHA256: ${crypto.createHash('sha256').update(data).digest('hex')}\n\n`)
  files.set('/apt/Packages', packages)
  files.set('/apt/Release', Buffer.from(`Origin: cella-test\nLabel: cella-test\nDate: ${new Date().toUTCString()}\nSHA256:\n ${crypto.createHash('sha256').update(packages).digest('hex')} ${packages.length} Packages\n`))
}

function buildWheels () {
  const out = path.join(work, 'wheels')
  fs.mkdirSync(out)
  execFileSync('python3', ['-c', `
import sys, zipfile, hashlib, base64, os
for name, ver in (('flask', '3.0.0'), ('requests', '2.31.0')):
    di = '%s-%s.dist-info' % (name, ver)
    fs = {name + '/__init__.py': '__version__ = "%s"\\nCELLA_STANDIN = True\\n' % ver,
          di + '/METADATA': 'Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n' % (name, ver),
          di + '/WHEEL': 'Wheel-Version: 1.0\\nGenerator: cella-compat\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'}
    rec = ['%s,sha256=%s,%d' % (p, base64.urlsafe_b64encode(hashlib.sha256(d.encode()).digest()).rstrip(b'=').decode(), len(d.encode())) for p, d in fs.items()]
    fs[di + '/RECORD'] = '\\n'.join(rec + [di + '/RECORD,,']) + '\\n'
    with zipfile.ZipFile(os.path.join(sys.argv[1], '%s-%s-py3-none-any.whl' % (name, ver)), 'w') as z:
        for p, d in fs.items():
            z.writestr(p, d)
`, out])
  const links = []
  for (const f of fs.readdirSync(out)) {
    const data = fs.readFileSync(path.join(out, f))
    const name = f.split('-')[0]
    files.set(`/files/${f}`, data)
    files.set(`/simple/${name}/`, Buffer.from(`<!DOCTYPE html><html><body><a href="/files/${f}#sha256=${crypto.createHash('sha256').update(data).digest('hex')}">${f}</a></body></html>\n`))
    links.push(`<a href="/simple/${name}/">${name}</a>`)
  }
  files.set('/simple/', Buffer.from(`<!DOCTYPE html><html><body>${links.join('\n')}</body></html>\n`))
}

// The build context: app/ (two files) and the CLI's Dockerfile dir.
const ctx = path.join(work, 'ctx')
const SERVER_PY = `import http.server, json, os
open('/home/user/app/.starts', 'a').write('%d\\n' % os.getpid())
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps({'path': self.path, 'appEnv': os.environ.get('APP_ENV'), 'pid': os.getpid()}).encode()
        self.send_response(200)
        self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ.get('PORT', '8000'))), H).serve_forever()
`
const CONFIG_JSON = `{"name":"cella-demo","run":"${RUN}"}\n`
fs.mkdirSync(path.join(ctx, 'app'), { recursive: true })
fs.writeFileSync(path.join(ctx, 'app/server.py'), SERVER_PY)
fs.writeFileSync(path.join(ctx, 'app/config.json'), CONFIG_JSON)

// A recording proxy in front of the harness's: it keeps the build triggers'
// whole bodies (scenario 16) and can tamper with upload URLs (scenario 14).
const triggers = [] // { url, body }
let tamperUploads = false
const front = http.createServer((req, res) => {
  req.on('error', () => {})
  res.on('error', () => {})
  const target = new URL(proxy.url)
  const chunks = []
  req.on('data', (c) => chunks.push(c))
  req.on('end', () => {
    const body = Buffer.concat(chunks)
    if (req.method === 'POST' && /^\/v2\/templates\/[^/]+\/builds\//.test(req.url)) triggers.push({ url: req.url, body: body.toString() })
    const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (ur) => {
      const isLink = req.method === 'GET' && /^\/templates\/[^/]+\/files\/[0-9a-f]{64}$/.test(req.url) && ur.statusCode === 201
      if (!(isLink && tamperUploads)) { res.writeHead(ur.statusCode, ur.headers); ur.pipe(res); return }
      const got = []
      ur.on('data', (c) => got.push(c))
      ur.on('end', () => {
        const link = JSON.parse(Buffer.concat(got).toString())
        const u = new URL(link.url)
        const tok = u.searchParams.get('token')
        u.searchParams.set('token', (tok[0] === 'a' ? 'b' : 'a') + tok.slice(1))
        const out = Buffer.from(JSON.stringify({ ...link, url: u.toString() }))
        res.writeHead(ur.statusCode, { 'content-type': 'application/json', 'content-length': out.length })
        res.end(out)
      })
    })
    up.on('error', (e) => { res.writeHead(502); res.end(String(e)) })
    up.end(body)
  })
})
await new Promise((resolve) => front.listen(0, '127.0.0.1', resolve))
const FRONT = `http://127.0.0.1:${front.address().port}`

function lastTrigger () {
  assert.ok(triggers.length > 0, 'no build trigger was sent')
  return JSON.parse(triggers.at(-1).body)
}

const logsOf = (entries) => entries.map((e) => e.message)

// build runs Template.build with a log collector and returns { info, logs }.
async function build (sdk, label, t, name, opts = {}) {
  const logs = []
  try {
    const info = await sdk(label, () => Template.build(t, name, { ...opts, onBuildLogs: (e) => logs.push(e) }))
    return { info, logs }
  } catch (e) {
    // The build's own log says why: show its end.
    e.message += `\nthe build log's last lines:\n${logs.slice(-60).map((l) => `  ${l.level} ${l.message}`).join('\n')}`
    throw e
  }
}

function demoTemplate () {
  return Template({ fileContextPath: ctx })
    .fromImage('python:3.12-slim')
    // The stand-in's apt and pip use the loopback mirror (nothing else is reachable).
    .runCmd([`printf 'deb [trusted=yes] ${MIRROR}/apt ./\\n' > /etc/apt/sources.list`, 'rm -f /etc/apt/sources.list.d/*',
      `printf '[global]\\nindex-url = ${MIRROR}/simple\\ntrusted-host = pkgs.test\\nbreak-system-packages = true\\ndisable-pip-version-check = true\\n' > /etc/pip.conf`],
    { user: 'root' })
    .aptInstall(['curl', 'git', 'cella-compat-tools'])
    .pipInstall(['flask==3.0.0', 'requests'])
    .runCmd('echo hello > /tmp/hello.txt')
    .copy('app', '/home/user/app')
    .setEnvs({ APP_ENV: 'prod', PORT: '8000' })
    .setWorkdir('/home/user/app')
    .setUser('user')
    .setStartCmd('python server.py', waitForPort(8000))
}

// cli runs the real CLI as a child; asynchronously, since its requests go
// through this process's recording proxy.
function cli (args, { env = {} } = {}) {
  const home = path.join(work, 'cli-home')
  fs.mkdirSync(home, { recursive: true })
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      cwd: work, stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH, HOME: home, NO_UPDATE_NOTIFIER: '1', E2B_API_KEY: ADMIN_KEY, E2B_API_URL: FRONT, ...env },
    })
    let out = ''
    child.stdout.on('data', (c) => { out += c })
    child.stderr.on('data', (c) => { out += c })
    const timer = setTimeout(() => child.kill('SIGKILL'), BUILD)
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, out }) })
  })
}

describe('e2b@2.51.0 Template and @e2b/cli@2.19.0 template', () => {
  const janitor = sandboxJanitor(Sandbox)
  const made = new Set() // template IDs to delete at the end
  let demo // BuildInfo of scenario 1
  let demoBody, derivedBody // trigger bodies (scenario 16)
  const apiUrl = process.env.E2B_API_URL

  before(() => {
    buildDeb()
    buildWheels()
    process.env.E2B_API_URL = FRONT
  })
  after(async () => {
    process.env.E2B_API_URL = apiUrl
    await Promise.all([...janitor.ids].map((id) => Sandbox.kill(id).catch(() => {})))
    for (const id of made) {
      await fetch(`${DAEMON_URL}/templates/${encodeURIComponent(id)}`, { method: 'DELETE', headers: { 'X-API-Key': ADMIN_KEY } }).catch(() => {})
    }
    await new Promise((resolve) => mirror.close(resolve))
    await new Promise((resolve) => front.close(resolve))
    fs.rmSync(work, { recursive: true, force: true })
  })

  step('template step 3: Template.exists is false before the build', async ({ sdk }) => {
    assert.equal(await sdk('Template.exists', () => Template.exists(ALIAS)), false)
  })

  step('template step 1: Template.build of fromImage + apt/pip from the loopback mirror + runCmd + copy + envs + workdir + user + start command', async ({ sdk, exchanges }) => {
    const t = demoTemplate()
    const { info, logs } = await build(sdk, 'Template.build', t, `${ALIAS}:v1`, { cpuCount: 2, memoryMB: 1024 })
    made.add(info.templateId)
    demo = info
    assert.equal(info.name, `${ALIAS}:v1`)
    assert.deepEqual(info.tags, ['v1'])
    assert.match(info.templateId, /^[a-z0-9]{20}$/)
    assert.match(info.buildId, /^[0-9a-f-]{36}$/)
    const msgs = logsOf(logs)
    const w = msgs.indexOf('Waiting for logs...')
    assert.ok(w >= 0, 'the SDK logged "Waiting for logs..."')
    const server = msgs.slice(w + 1, -1)
    assert.ok(server.some((m) => m.startsWith('Building template')), 'the server\'s lines follow "Waiting for logs..."')
    assert.ok(server.some((m) => /\[builder 2\/8\] RUN apt-get update/.test(m)), 'the apt step is logged')
    assert.ok(server.some((m) => m.startsWith('Build finished')), 'the server says the build finished')
    assert.equal(logs.at(-1).constructor.name, 'LogEntryEnd')
    const puts = matching(exchanges(), 'PUT', /^\/templates\/[^/]+\/files\/[0-9a-f]{64}\?/)
    assert.equal(puts.length, 1, 'exactly one upload')
    assert.equal(puts[0].status, 200)
    assert.ok(served.apt > 0 && served.pip > 0, `the build used the loopback mirror (apt ${served.apt}, pip ${served.pip} requests)`)
    demoBody = lastTrigger()
    demoBody.templateJSON = JSON.parse(await Template.toJSON(t))
  }, { timeout: BUILD })

  step('template step 2: Sandbox.create(alias) and (alias:v1) start from the build: user, workdir, env, files, owner, and port 8000 answers at once', async ({ sdk }) => {
    assert.ok(demo, 'scenario 1 built the template')
    for (const name of [ALIAS, `${ALIAS}:v1`]) {
      const sbx = janitor.track(await sdk(`Sandbox.create(${name})`, () => Sandbox.create(name)))
      const run = async (cmd) => (await sdk(`commands.run(${cmd})`, () => sbx.commands.run(cmd))).stdout.trim()
      const web = await run('curl -s --max-time 5 localhost:8000/')
      assert.equal(JSON.parse(web).appEnv, 'prod', 'the start command answers on 8000 the moment create returned')
      assert.equal(await run('whoami'), 'user')
      assert.equal(await run('pwd'), '/home/user/app')
      assert.equal(await run('echo $APP_ENV'), 'prod')
      assert.equal(await run('cat /home/user/app/config.json'), CONFIG_JSON.trim())
      assert.equal(await run('stat -c %U /home/user/app/config.json'), 'user')
      assert.equal(await run('python3 -c "import flask; print(flask.__version__)"'), '3.0.0')
      assert.equal(await run("dpkg-query -W -f '${Status}' cella-compat-tools"), 'install ok installed')
      assert.equal((await run('cat /home/user/app/.starts')).split('\n').length, 1, 'the start command ran once, at build time')
      await sbx.kill()
    }
  }, { timeout: 180_000 })

  // E2B keeps a RUN step's /tmp in the template (§9 scenario 2: cat
  // /tmp/hello.txt): under gVisor /tmp is the root's own directory, not
  // runsc's tmpfs, so it is in the step's captured layer.
  it('template step 2 (/tmp): a RUN step\'s /tmp/hello.txt is in the sandbox', {
    timeout: 120_000,
  }, async () => {
    assert.ok(demo, 'scenario 1 built the template')
    const sbx = janitor.track(await Sandbox.create(ALIAS))
    try {
      assert.equal((await sbx.commands.run('cat /tmp/hello.txt')).stdout.trim(), 'hello')
    } finally {
      await sbx.kill()
    }
  })

  step('template step 3: Template.exists is true after the build, false for an unknown tag', async ({ sdk }) => {
    assert.equal(await sdk('Template.exists', () => Template.exists(ALIAS)), true)
    assert.equal(await sdk('Template.exists(:v1)', () => Template.exists(`${ALIAS}:v1`)), true)
    assert.equal(await sdk('Template.exists(:nosuchtag)', () => Template.exists(`${ALIAS}:nosuchtag`)), false)
  })

  step('template step 4: a rebuild is served from the cache: no upload, cached layers, the new tags', async ({ sdk, exchanges }) => {
    const { info, logs } = await build(sdk, 'Template.build (rebuild)', demoTemplate(), ALIAS, { tags: ['stable', 'v2'] })
    assert.equal(info.templateId, demo.templateId)
    assert.deepEqual([...info.tags].sort(), ['stable', 'v2'])
    const msgs = logsOf(logs)
    assert.ok(msgs.includes("Skipping upload of 'app', already cached"), 'the files are cached')
    assert.equal(matching(exchanges(), 'PUT', /\/files\//).length, 0, 'no PUT')
    for (const n of ['1', '2', '3', '4', '5']) {
      assert.ok(msgs.some((m) => m.startsWith(`CACHED [builder ${n}/8]`)), `step ${n} is cached`)
    }
  }, { timeout: BUILD })

  step('template step 5: skipCache rebuilds every layer; skipCache() mid-template rebuilds from there; a changed file re-uploads and rebuilds from its COPY', async ({ sdk, exchanges }) => {
    const forced = await build(sdk, 'Template.build (skipCache)', demoTemplate(), ALIAS, { skipCache: true })
    assert.equal(lastTrigger().force, true)
    assert.ok(!logsOf(forced.logs).some((m) => m.startsWith('CACHED [builder')), 'no step is cached')

    const name = `cella-skip-${RUN}`
    const mid = () => Template().fromBaseImage().runCmd(`echo a-${RUN}`).skipCache().runCmd(`echo b-${RUN}`)
    made.add((await build(sdk, 'Template.build (mid, first)', mid(), name)).info.templateId)
    const second = logsOf((await build(sdk, 'Template.build (mid, again)', mid(), name)).logs)
    assert.ok(second.some((m) => m.startsWith('CACHED [builder 1/2]')), 'the step before skipCache() is cached')
    assert.ok(!second.some((m) => m.startsWith('CACHED [builder 2/2]')), 'the step after skipCache() is rebuilt')

    const fctx = path.join(work, 'files-ctx')
    fs.mkdirSync(path.join(fctx, 'app'), { recursive: true })
    fs.writeFileSync(path.join(fctx, 'app/a.txt'), 'one')
    const withFile = () => Template({ fileContextPath: fctx }).fromBaseImage().runCmd(`echo before-${RUN}`).copy('app', '/srv/app').runCmd('cat /srv/app/a.txt')
    const fname = `cella-files-${RUN}`
    made.add((await build(sdk, 'Template.build (files, first)', withFile(), fname)).info.templateId)
    const mark = exchanges().length
    fs.writeFileSync(path.join(fctx, 'app/a.txt'), 'two')
    const changed = logsOf((await build(sdk, 'Template.build (files, changed)', withFile(), fname)).logs)
    assert.equal(matching(exchanges().slice(mark), 'PUT', /\/files\//).length, 1, 'the changed files are uploaded')
    assert.ok(changed.some((m) => m.startsWith('CACHED [builder 1/3]')), 'the step before the COPY is cached')
    assert.ok(!changed.some((m) => m.startsWith('CACHED [builder 2/3]')), 'the COPY is rebuilt')
    assert.ok(!changed.some((m) => m.startsWith('CACHED [builder 3/3]')), 'the step after it is rebuilt')
  }, { timeout: 4 * BUILD })

  step('template step 6: copy({forceUpload:true}) uploads although present, and the step runs uncached', async ({ sdk, exchanges }) => {
    const t = () => Template({ fileContextPath: ctx }).fromBaseImage().copy('app/config.json', '/srv/', { forceUpload: true })
    const name = `cella-force-${RUN}`
    made.add((await build(sdk, 'Template.build (forceUpload, first)', t(), name)).info.templateId)
    const mark = exchanges().length
    const { logs } = await build(sdk, 'Template.build (forceUpload, again)', t(), name)
    const links = matching(exchanges().slice(mark), 'GET', /\/files\/[0-9a-f]{64}$/)
    assert.ok(links.length === 1 && links[0].resBody.toString().includes('"present":true'), 'the files were present')
    assert.equal(matching(exchanges().slice(mark), 'PUT', /\/files\//).length, 1, 'and uploaded anyway')
    assert.ok(!logsOf(logs).some((m) => m.startsWith('CACHED [builder 1/1]')), 'the COPY ran uncached')
  }, { timeout: 2 * BUILD })

  step('template step 7: buildInBackground returns at the trigger; getBuildStatus pages the log without gaps or repeats, ≤ 100 a page, then an empty page', async ({ sdk }) => {
    const t = Template().fromBaseImage().runCmd('for i in $(seq 1 250); do echo "line $i"; done')
    const info = await sdk('Template.buildInBackground', () => Template.buildInBackground(t, `cella-bg-${RUN}`, { skipCache: true }))
    made.add(info.templateId)
    const first = await sdk('Template.getBuildStatus', () => Template.getBuildStatus(info))
    assert.ok(['waiting', 'building', 'ready'].includes(first.status), `status right after the trigger: ${first.status}`)
    const seen = new Set(); const all = []
    let offset = 0; let status
    for (const deadline = Date.now() + BUILD; ;) {
      const page = await sdk('Template.getBuildStatus({logsOffset})', () => Template.getBuildStatus(info, { logsOffset: offset }))
      assert.ok(page.logEntries.length <= 100, `a page of ${page.logEntries.length}`)
      for (const e of page.logEntries) all.push(e.message)
      offset += page.logEntries.length
      seen.add(page.status)
      status = page.status
      if ((status === 'ready' || status === 'error') && page.logEntries.length === 0) break
      assert.ok(Date.now() < deadline, 'the build did not end in time')
      await sleep(200)
    }
    assert.equal(status, 'ready')
    const lines = all.filter((m) => /\[stdout\]: line \d+$/.test(m)).map((m) => Number(m.match(/line (\d+)$/)[1]))
    assert.deepEqual(lines, Array.from({ length: 250 }, (_, i) => i + 1), 'each output line once, in order')
    const again = await sdk('Template.getBuildStatus (from 0)', () => Template.getBuildStatus(info))
    assert.equal(again.logEntries[0].message, all[0], 'without an offset the log starts at 0')
  }, { timeout: BUILD })

  step('template step 8: a failing RUN is a BuildError with the server\'s reason, its stack at the .runCmd(\'false\') line', async ({ sdk }) => {
    let t = Template().fromDebianImage('bookworm').runCmd('echo step1').runCmd('echo step2')
    const line = lineOf(); t = t.runCmd('false')
    const logs = []
    const err = await rejects(sdk('Template.build (failing)', () => Template.build(t, `cella-fail-${RUN}`, { onBuildLogs: (e) => logs.push(e) })))
    assert.ok(err instanceof BuildError, `a BuildError, got ${err?.name}: ${err?.message}`)
    assert.equal(err.message, "failed to run command 'false': exit status 1")
    assert.ok(err.stack.includes(`template.test.mjs:${line}:`), `the stack points at line ${line}:\n${err.stack}`)
    assert.equal(logs.at(-1).constructor.name, 'LogEntryEnd', 'onBuildLogs still got the end')
    const status = await fetch(`${DAEMON_URL}/templates/aliases/cella-fail-${RUN}`, { headers: { 'X-API-Key': ADMIN_KEY } }).then((r) => r.json())
    if (status.templateID) made.add(status.templateID)
  }, { timeout: BUILD })

  step('template step 9: a ready command that never succeeds fails at finalize; fromTemplate of nothing fails at base', async ({ sdk }) => {
    let t = Template().fromBaseImage()
    const line = lineOf(); t = t.setStartCmd('sleep infinity', 'exit 1')
    const err = await rejects(sdk('Template.build (ready never)', () => Template.build(t, `cella-ready-${RUN}`)))
    assert.ok(err instanceof BuildError, `${err?.name}: ${err?.message}`)
    assert.match(err.message, /ready command/)
    assert.ok(err.stack.includes(`template.test.mjs:${line}:`), `the stack points at the setStartCmd line ${line}:\n${err.stack}`)

    const base = lineOf(); const missing = Template().fromTemplate(`does-not-exist-${RUN}`)
    const err2 = await rejects(sdk('Template.build (no base)', () => Template.build(missing, `cella-nobase-${RUN}`)))
    assert.ok(err2 instanceof BuildError, `${err2?.name}: ${err2?.message}`)
    assert.match(err2.message, /not found/)
    assert.ok(err2.stack.includes(`template.test.mjs:${base}:`), `the stack points at the fromTemplate line ${base}:\n${err2.stack}`)
    for (const a of [`cella-ready-${RUN}`, `cella-nobase-${RUN}`]) {
      const s = await fetch(`${DAEMON_URL}/templates/aliases/${a}`, { headers: { 'X-API-Key': ADMIN_KEY } }).then((r) => r.json())
      if (s.templateID) made.add(s.templateID)
    }
  }, { timeout: 2 * BUILD })

  step('template step 10: fromTemplate inherits the start command and files; its sandbox sees the server and the new step, and has the size it was built with', async ({ sdk }) => {
    assert.ok(demo, 'scenario 1 built the template')
    const t = Template().fromTemplate(ALIAS).runCmd('echo derived > /home/user/derived.txt').setReadyCmd(waitForURL('http://localhost:8000/health'))
    const cache = process.env.CELLA_CACHE_DIR || '/var/cache/cella'
    const diag = () => fs.readdirSync(path.join(cache, 'names')).filter((n) => n.includes(demo.templateId)).map((n) => {
      const rec = JSON.parse(fs.readFileSync(path.join(cache, 'names', n), 'utf8'))
      const chain = []
      for (let key = rec.image; key && chain.length < 8;) {
        const f = path.join(cache, 'images', key, 'image.json')
        if (!fs.existsSync(f)) { chain.push(`${key} MISSING`); break }
        chain.push(key)
        key = JSON.parse(fs.readFileSync(f, 'utf8')).base
      }
      return `${n}: ${chain.join(' <- ')}`
    }).join('\n')
    const before = diag()
    const { info } = await build(sdk, 'Template.build (derived)', t, `cella-derived-${RUN}`, { cpuCount: 1, memoryMB: 768 }).catch((e) => {
      e.message += `\nthe template's names before the build:\n${before}\nand after:\n${diag()}`
      throw e
    })
    made.add(info.templateId)
    derivedBody = lastTrigger()
    derivedBody.templateJSON = JSON.parse(await Template.toJSON(t))
    const sbx = janitor.track(await sdk('Sandbox.create (derived)', () => Sandbox.create(`cella-derived-${RUN}`)))
    // A sandbox is the size its template was built with, as on E2B.
    const got = await sdk('getInfo (derived)', () => sbx.getInfo())
    assert.deepEqual([got.cpuCount, got.memoryMB], [1, 768], 'the build\'s cpuCount and memoryMB')
    const run = async (cmd) => (await sdk(`commands.run(${cmd})`, () => sbx.commands.run(cmd))).stdout.trim()
    assert.equal(JSON.parse(await run('curl -s --max-time 5 localhost:8000/health')).path, '/health')
    assert.equal(await run('cat /home/user/derived.txt'), 'derived')
    assert.equal(await run('cat /home/user/app/config.json'), CONFIG_JSON.trim())
    await sbx.kill()
  }, { timeout: BUILD })

  step('template step 12: e2b template create (Dockerfile, no Docker), list, publish, delete, a second delete, and the deprecated build', async () => {
    const dir = path.join(work, 'cli-ctx')
    fs.mkdirSync(dir, { recursive: true })
    fs.writeFileSync(path.join(dir, 'e2b.Dockerfile'), 'FROM python:3.12-slim\nCOPY app.py /home/user/app.py\nRUN echo built > /tmp/built.txt\n')
    fs.writeFileSync(path.join(dir, 'app.py'), 'import time\nwhile True:\n    time.sleep(60)\n')
    const name = `cella-cli-${RUN}`
    const created = await cli(['template', 'create', name, '--path', dir, '--cmd', 'python3 app.py', '--ready-cmd', 'sleep 1'])
    assert.equal(created.code, 0, `e2b template create:\n${created.out}`)
    const listed = await cli(['template', 'list', '-f', 'json'])
    assert.equal(listed.code, 0, listed.out)
    const mine = JSON.parse(listed.out.slice(listed.out.indexOf('['))).find((x) => x.aliases.includes(name))
    assert.ok(mine, `e2b template list shows ${name}:\n${listed.out}`)
    made.add(mine.templateID)
    const pretty = await cli(['template', 'list'])
    assert.equal(pretty.code, 0, pretty.out)
    assert.ok(pretty.out.includes(name), `the table shows it:\n${pretty.out}`)
    const pub = await cli(['template', 'publish', mine.templateID, '-y'])
    assert.equal(pub.code, 0, pub.out)
    assert.match(pub.out, /Published as:/)
    const del = await cli(['template', 'delete', mine.templateID, '-y'])
    assert.equal(del.code, 0, del.out)
    const again = await cli(['template', 'delete', mine.templateID, '-y'])
    assert.equal(again.code, 1, again.out)
    assert.match(again.out, /\[404\]/)
    const old = await cli(['template', 'build'])
    assert.equal(old.code, 1, old.out)
    assert.match(old.out, /DEPRECAT/i)
  }, { timeout: BUILD })

  step('template step 14: HTTP errors: a bad name (400), an alias of another team (409), a wrong key, an unknown build, a tampered upload URL', async ({ sdk }) => {
    const t = Template().fromBaseImage().runCmd('true')
    const bad = await rejects(sdk('Template.build (bad name)', () => Template.build(t, 'Bad Name!')))
    assert.ok(bad instanceof BuildError && bad.message.startsWith('400:'), `${bad?.name}: ${bad?.message}`)

    const k = await fetch(`${DAEMON_URL}/keys`, { method: 'POST', headers: { 'X-API-Key': ADMIN_KEY, 'Content-Type': 'application/json' }, body: JSON.stringify({ name: `other-${RUN}`, team: `other-${RUN}` }) }).then((r) => r.json())
    const conflict = await rejects(sdk('Template.build (foreign alias)', () => Template.build(t, ALIAS, { apiKey: k.key })))
    assert.ok(conflict instanceof BuildError && conflict.message.startsWith('409:'), `${conflict?.name}: ${conflict?.message}`)
    assert.equal(await sdk('Template.exists (foreign, private)', () => Template.exists(ALIAS, { apiKey: k.key })), false, 'a foreign private template is not found')
    const foreign = await rejects(sdk('Sandbox.create (foreign)', () => Sandbox.create(ALIAS, { apiKey: k.key })))
    const unknown = await rejects(sdk('Sandbox.create (unknown)', () => Sandbox.create(`nosuch-${RUN}`, { apiKey: k.key })))
    assert.equal(foreign.message.replaceAll(ALIAS, 'X'), unknown.message.replaceAll(`nosuch-${RUN}`, 'X'), 'a foreign template fails as an unknown one')

    const auth = await rejects(sdk('Template.build (wrong key)', () => Template.build(t, `cella-auth-${RUN}`, { apiKey: 'e2b_00000000000000000000000000000000' })))
    assert.ok(auth instanceof AuthenticationError, `${auth?.name}: ${auth?.message}`)

    const status = await rejects(sdk('Template.getBuildStatus (unknown)', () => Template.getBuildStatus({ templateId: demo?.templateId ?? 'x', buildId: '00000000-0000-4000-8000-000000000000' })))
    assert.ok(status instanceof BuildError && /^40[04]:/.test(status.message), `${status?.name}: ${status?.message}`)

    const tctx = path.join(work, 'tamper-ctx')
    fs.mkdirSync(tctx, { recursive: true })
    fs.writeFileSync(path.join(tctx, 'f.txt'), `unique ${RUN}`)
    tamperUploads = true
    try {
      const up = await rejects(sdk('Template.build (tampered upload URL)', () => Template.build(Template({ fileContextPath: tctx }).fromBaseImage().copy('f.txt', '/f.txt'), `cella-tamper-${RUN}`)))
      assert.ok(up instanceof FileUploadError, `${up?.name}: ${up?.message}`)
      assert.equal(up.message, 'Failed to upload file: Forbidden')
    } finally {
      tamperUploads = false
    }
    for (const a of [`cella-tamper-${RUN}`]) {
      const s = await fetch(`${DAEMON_URL}/templates/aliases/${a}`, { headers: { 'X-API-Key': ADMIN_KEY } }).then((r) => r.json())
      if (s.templateID) made.add(s.templateID)
    }
    await fetch(`${DAEMON_URL}/keys/${k.id}`, { method: 'DELETE', headers: { 'X-API-Key': ADMIN_KEY } })
  }, { timeout: 120_000 })

  step('template step 16: Template.toJSON equals the trigger bodies the server received (scenarios 1 and 10)', async () => {
    for (const [what, b] of [['scenario 1', demoBody], ['scenario 10', derivedBody]]) {
      assert.ok(b, `${what} ran`)
      const { templateJSON, ...sent } = b
      assert.deepEqual(sent, templateJSON, `${what}: the body sent is Template.toJSON's`)
    }
    assert.equal(demoBody.fromImage, 'python:3.12-slim')
    assert.equal(demoBody.readyCmd, '[ -n "$(ss -Htuln sport = :8000)" ]')
    assert.equal(derivedBody.fromTemplate, ALIAS)
    assert.equal(derivedBody.fromImage, undefined)
  })

  step('template step 13 (tags): assignTags, getTags, removeTags; a removed tag no longer creates', async ({ sdk }) => {
    assert.ok(demo, 'scenario 1 built the template')
    const a = await sdk('Template.assignTags', () => Template.assignTags(`${ALIAS}:v1`, 'production'))
    assert.deepEqual(a, { buildId: demo.buildId, tags: ['production'] })
    const tags = await sdk('Template.getTags', () => Template.getTags(demo.templateId))
    const names = tags.map((x) => x.tag).sort()
    for (const want of ['production', 'stable', 'v1', 'v2']) assert.ok(names.includes(want), `getTags lists ${want}: ${names}`)
    assert.equal(tags.find((x) => x.tag === 'production').buildId, demo.buildId)
    assert.ok(tags.every((x) => x.createdAt instanceof Date && !isNaN(x.createdAt)))
    await sdk('Template.removeTags', () => Template.removeTags(ALIAS, 'production'))
    const gone = await rejects(sdk('Sandbox.create(:production)', () => Sandbox.create(`${ALIAS}:production`)))
    assert.match(gone.message, /not|404/)
  })

})

after(() => closeProxy())
