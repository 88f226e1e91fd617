// E2B SDK conformance: the real, unmodified `e2b` JS SDK (three versions)
// against a cella daemon, following the checklist of /work/shared/e2b-api.md
// §5 (steps 1-15; step 17 = its "nice to have" list: snapshots and fork,
// watchDir, PTY, signed URLs, getMetrics). Run with ./run.sh, which starts
// the daemon.
//
// Each SDK version gets its own describe block. Inside a block the tests run
// in order and share one sandbox (created in step 2) where they do not
// interfere; steps 9, 10 and 12 create their own.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  step, rejects, waitFor, httpRequest, sandboxJanitor, closeProxy,
  matching, one, jsonBody, near, between,
} from './lib/harness.mjs'

const VERSIONS = ['2.45.0', '2.50.0', '2.51.0']
// What cella reports; the SDK gates octet-stream/gzip uploads on >= 0.5.7,
// file metadata on 0.6.2, watchDir({includeEntry}) on 0.6.3 and
// watchDir({allowNetworkMounts}) on 0.6.4 (fidelity.test.mjs).
const ENVD_VERSION = '0.6.4'
// Tags this run's sandboxes so list filters see only ours.
const RUN = `r${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`
const UNKNOWN_ID = 'nosuchsandbox0000000'

const enc = new TextEncoder()
const dec = new TextDecoder()

async function streamText (stream) {
  let out = ''
  for await (const chunk of stream) out += typeof chunk === 'string' ? chunk : dec.decode(chunk, { stream: true })
  return out
}

// All SDKs are loaded before any describe block is registered: a top-level
// await between registrations would let the runner finish early.
const SDKS = await Promise.all(VERSIONS.map((v) => import(`e2b-${v}`)))

for (const [i, version] of VERSIONS.entries()) {
  const e2b = SDKS[i]
  const {
    Sandbox, CommandExitError, AuthenticationError, NotFoundError, SandboxNotFoundError,
    FileNotFoundError, TimeoutError, FilesystemEventType,
  } = e2b
  // 2.51.0 is the first SDK that creates/connects via the /v2 paths.
  const usesV2 = version === '2.51.0'
  const createPath = usesV2 ? /^\/v2\/sandboxes$/ : /^\/sandboxes$/
  const connectPath = (id) => new RegExp(`^${usesV2 ? '/v2' : ''}/sandboxes/${id}/connect$`)

  describe(`e2b@${version}`, () => {
    const janitor = sandboxJanitor(Sandbox)
    const META = { suite: 'cella-e2b-compat', run: RUN, v: version }
    let sbx // the shared sandbox (step 2)
    let extras = [] // two more sandboxes for list (step 10) and kill (step 12)
    const shared = () => { assert.ok(sbx, 'no shared sandbox: step 2 (Sandbox.create) failed'); return sbx }
    const routing = (port = 49983) => ({ 'E2b-Sandbox-Id': shared().sandboxId, 'E2b-Sandbox-Port': String(port) })

    // ---------------------------------------------------------------- step 1
    step('step 1: GET /health answers 204 without an API key', async () => {
      const res = await httpRequest({ path: '/health' })
      assert.equal(res.status, 204)
    })

    step('step 1: a wrong API key → 401 JSON {code,message} → AuthenticationError', async ({ sdk, exchanges }) => {
      const err = await rejects(sdk('Sandbox.list({apiKey: <wrong key>}).nextItems()',
        () => Sandbox.list({ apiKey: 'e2b_' + '0'.repeat(32) }).nextItems()))
      assert.ok(err instanceof AuthenticationError, `expected AuthenticationError, got ${err?.name}: ${err?.message}`)
      const ex = one(exchanges(), 'GET', /^\/v2\/sandboxes/)
      assert.equal(ex.status, 401)
      const body = jsonBody(ex)
      assert.equal(body.code, 401)
      assert.equal(typeof body.message, 'string')
    })

    step('step 1: an unknown sandbox → 404 JSON {code:404} → SandboxNotFoundError', async ({ sdk, exchanges }) => {
      const err = await rejects(sdk(`Sandbox.getInfo('${UNKNOWN_ID}')`, () => Sandbox.getInfo(UNKNOWN_ID)))
      assert.ok(err instanceof SandboxNotFoundError, `expected SandboxNotFoundError, got ${err?.name}: ${err?.message}`)
      const ex = one(exchanges(), 'GET', new RegExp(`^/sandboxes/${UNKNOWN_ID}$`))
      assert.equal(ex.status, 404)
      assert.match(ex.resHeaders['content-type'] ?? '', /application\/json/)
      const body = jsonBody(ex)
      assert.equal(body.code, 404)
      assert.equal(typeof body.message, 'string')
    })

    // ---------------------------------------------------------------- step 2
    step('step 2: Sandbox.create({metadata, envs, timeoutMs}) → 201 Sandbox', async ({ sdk, exchanges }) => {
      sbx = await sdk('Sandbox.create({metadata, envs, timeoutMs: 120000})',
        () => Sandbox.create({ metadata: META, envs: { FOO: 'bar', SPACED: 'a b' }, timeoutMs: 120_000 }))
      janitor.track(sbx)
      assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
      assert.ok(sbx.sandboxDomain && sbx.sandboxDomain !== 'e2b.app', `the create response must carry a domain (got ${sbx.sandboxDomain})`)

      const ex = one(exchanges(), 'POST', createPath)
      assert.equal(ex.status, 201)
      const req = jsonBody(ex, 'req')
      assert.equal(req.templateID, 'base')
      assert.equal(req.timeout, 120)
      assert.deepEqual(req.metadata, META)
      assert.deepEqual(req.envVars, { FOO: 'bar', SPACED: 'a b' })
      const res = jsonBody(ex)
      assert.equal(res.sandboxID, sbx.sandboxId)
      for (const k of ['templateID', 'clientID', 'envdVersion', 'envdAccessToken', 'domain']) {
        assert.ok(res[k], `create response lacks ${k}: ${ex.resBody}`)
      }
      assert.equal(res.envdVersion, ENVD_VERSION)
    })

    step('step 2: the create envs reach every command', async ({ sdk }) => {
      const r = await sdk("sbx.commands.run('echo \"$FOO|$SPACED\"')", () => shared().commands.run('echo "$FOO|$SPACED"'))
      assert.equal(r.stdout, 'bar|a b\n')
    })

    // ---------------------------------------------------------------- step 3
    step('step 3: sandbox traffic: header/Host routing, X-Access-Token, 502 for an unknown sandbox', async ({ sdk, exchanges }) => {
      const s = shared()
      assert.equal(await sdk('sbx.isRunning()', () => s.isRunning()), true)
      const health = one(exchanges(), 'GET', /^\/health$/)
      assert.equal(health.reqHeaders['e2b-sandbox-id'], s.sandboxId)
      assert.equal(health.status, 204)

      // The same envd reached by Host <port>-<id>.<domain> (E2B's edge form).
      const byHost = await httpRequest({ path: '/health', headers: { Host: `49983-${s.sandboxId}.${s.sandboxDomain}` } })
      assert.equal(byHost.status, 204, `GET /health with Host 49983-<id>.<domain>: ${byHost.status} ${byHost.body}`)

      // envd RPCs need the sandbox's X-Access-Token.
      const rpc = { path: '/process.Process/List', method: 'POST', body: '{}' }
      const noToken = await httpRequest({ ...rpc, headers: { ...routing(), 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' } })
      assert.equal(noToken.status, 401, `Process/List without X-Access-Token: ${noToken.status} ${noToken.body}`)
      assert.ok(s.envdAccessToken, 'the SDK got no envdAccessToken from create')
      const withToken = await httpRequest({ ...rpc, headers: { ...routing(), 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', 'X-Access-Token': s.envdAccessToken } })
      assert.equal(withToken.status, 200, `Process/List with X-Access-Token: ${withToken.status} ${withToken.body}`)
      assert.ok(Array.isArray(JSON.parse(withToken.body).processes ?? []))

      // Unknown sandbox: 502 JSON, which the SDK's isRunning() reads as false.
      const unknown = await httpRequest({ path: '/health', headers: { 'E2b-Sandbox-Id': UNKNOWN_ID, 'E2b-Sandbox-Port': '49983' } })
      assert.equal(unknown.status, 502, `GET /health for an unknown sandbox: ${unknown.status} ${unknown.body}`)
      assert.match(unknown.headers['content-type'] ?? '', /application\/json/)
      assert.equal(JSON.parse(unknown.body).code, 502)
    })

    // ---------------------------------------------------------------- step 4
    step("step 4: commands.run('echo hi') → {exitCode 0, stdout, stderr}", async ({ sdk, exchanges }) => {
      const r = await sdk("sbx.commands.run('echo hi')", () => shared().commands.run('echo hi'))
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'hi\n')
      assert.equal(r.stderr, '')
      assert.equal(r.error, undefined)
      const ex = one(exchanges(), 'POST', /^\/process\.Process\/Start$/)
      assert.equal(ex.resHeaders['content-type'], 'application/connect+json')
    })

    step('step 4: exit 3 → CommandExitError with exitCode, stdout, stderr', async ({ sdk }) => {
      const err = await rejects(sdk("sbx.commands.run('echo out; echo err >&2; exit 3')",
        () => shared().commands.run('echo out; echo err >&2; exit 3')))
      assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`)
      assert.equal(err.exitCode, 3)
      assert.equal(err.stdout, 'out\n')
      assert.equal(err.stderr, 'err\n')
      assert.equal(err.message, 'exit status 3')
    })

    step('step 4: default user/cwd; user, cwd and envs options; onStdout/onStderr', async ({ sdk, exchanges }) => {
      const s = shared()
      const d = await sdk("sbx.commands.run('id -un; pwd; echo $HOME')", () => s.commands.run('id -un; pwd; echo $HOME'))
      assert.equal(d.stdout, 'user\n/home/user\n/home/user\n')

      const r = await sdk("sbx.commands.run('id -un; pwd; echo $A', {user:'root', cwd:'/tmp', envs:{A:'1'}})",
        () => s.commands.run('id -un; pwd; echo $A', { user: 'root', cwd: '/tmp', envs: { A: '1' } }))
      assert.equal(r.stdout, 'root\n/tmp\n1\n')
      const start = matching(exchanges(), 'POST', /^\/process\.Process\/Start$/).at(-1)
      assert.equal(start.reqHeaders.authorization, 'Basic cm9vdDo=')

      const out = []; const err = []
      const c = await sdk("sbx.commands.run('echo a; echo b >&2', {onStdout, onStderr})",
        () => s.commands.run('echo a; echo b >&2', { onStdout: (x) => out.push(x), onStderr: (x) => err.push(x) }))
      assert.equal(out.join(''), 'a\n')
      assert.equal(err.join(''), 'b\n')
      assert.equal(c.stdout, 'a\n')
    })

    step('step 4: large output arrives whole; timeoutMs bounds the command', async ({ sdk }) => {
      const s = shared()
      const big = await sdk("sbx.commands.run('head -c 300000 /dev/zero | tr \"\\\\0\" x')",
        () => s.commands.run('head -c 300000 /dev/zero | tr "\\0" x'))
      assert.equal(big.stdout.length, 300000)
      assert.ok(/^x+$/.test(big.stdout))

      const t0 = Date.now()
      const err = await rejects(sdk("sbx.commands.run('sleep 20', {timeoutMs: 1500})",
        () => s.commands.run('sleep 20', { timeoutMs: 1500 })))
      assert.ok(err instanceof TimeoutError || err instanceof CommandExitError,
        `expected TimeoutError (or CommandExitError), got ${err?.name}: ${err?.message}`)
      assert.ok(Date.now() - t0 < 10_000, `the command was not stopped in time (${Date.now() - t0} ms)`)
    })

    // ---------------------------------------------------------------- step 5
    step('step 5: files.write single (multipart) creates parents, overwrites, resolves relative paths', async ({ sdk, exchanges }) => {
      const s = shared()
      const info = await sdk("sbx.files.write('/home/user/d5/a.txt', 'hello')", () => s.files.write('/home/user/d5/a.txt', 'hello'))
      assert.equal(info.path, '/home/user/d5/a.txt')
      assert.equal(info.name, 'a.txt')
      assert.equal(info.type, 'file')
      const ex = one(exchanges(), 'POST', /^\/files\?/)
      assert.match(ex.url, /[?&]path=%2Fhome%2Fuser%2Fd5%2Fa\.txt/)
      assert.match(ex.reqHeaders['content-type'], /^multipart\/form-data/)
      assert.equal(ex.status, 200)

      assert.equal(await sdk("sbx.files.read('/home/user/d5/a.txt')", () => s.files.read('/home/user/d5/a.txt')), 'hello')
      const st = await sdk("sbx.files.getInfo('/home/user/d5/a.txt')", () => s.files.getInfo('/home/user/d5/a.txt'))
      assert.equal(st.owner, 'user')

      await sdk("sbx.files.write('/home/user/d5/a.txt', 'hi')", () => s.files.write('/home/user/d5/a.txt', 'hi'))
      assert.equal(await sdk("sbx.files.read('/home/user/d5/a.txt')", () => s.files.read('/home/user/d5/a.txt')), 'hi')

      const rel = await sdk("sbx.files.write('rel5.txt', 'relative')", () => s.files.write('rel5.txt', 'relative'))
      assert.equal(rel.path, '/home/user/rel5.txt')
      assert.equal(await sdk("sbx.files.read('/home/user/rel5.txt')", () => s.files.read('/home/user/rel5.txt')), 'relative')
    })

    step('step 5: files.write([...]) writes several files in one multipart request', async ({ sdk, exchanges }) => {
      const s = shared()
      const bin = new Uint8Array([0, 1, 2, 253, 254, 255])
      const infos = await sdk("sbx.files.write([{path:'/home/user/m5/1.txt'}, {path:'/home/user/m5/sub/2.bin'}])",
        () => s.files.write([{ path: '/home/user/m5/1.txt', data: 'one' }, { path: '/home/user/m5/sub/2.bin', data: bin }]))
      assert.ok(Array.isArray(infos), 'a multi-file write returns an array')
      assert.deepEqual(infos.map((i) => i.path).sort(), ['/home/user/m5/1.txt', '/home/user/m5/sub/2.bin'])
      const ex = one(exchanges(), 'POST', /^\/files/)
      assert.equal(ex.url, '/files', 'a multi-file write has no path query')
      assert.equal(await sdk("sbx.files.read('/home/user/m5/1.txt')", () => s.files.read('/home/user/m5/1.txt')), 'one')
      const back = await sdk("sbx.files.read('/home/user/m5/sub/2.bin', {format:'bytes'})",
        () => s.files.read('/home/user/m5/sub/2.bin', { format: 'bytes' }))
      assert.deepEqual([...back], [...bin])
    })

    step(`step 5: files.write with {gzip:true}, {useOctetStream:true} and a ReadableStream (envd ${ENVD_VERSION})`, async ({ sdk, exchanges }) => {
      const s = shared()
      const text = 'gzipped hello\n'.repeat(100)
      await sdk("sbx.files.write('/home/user/g5/g.txt', text, {gzip:true})", () => s.files.write('/home/user/g5/g.txt', text, { gzip: true }))
      const gz = one(exchanges(), 'POST', /^\/files\?path=%2Fhome%2Fuser%2Fg5%2Fg\.txt/)
      assert.equal(gz.reqHeaders['content-type'], 'application/octet-stream')
      assert.equal(gz.reqHeaders['content-encoding'], 'gzip')
      assert.equal(gz.status, 200)
      assert.equal(await sdk("sbx.files.read('/home/user/g5/g.txt')", () => s.files.read('/home/user/g5/g.txt')), text)

      const bytes = new Uint8Array(256).map((_, i) => i)
      await sdk("sbx.files.write('/home/user/g5/raw.bin', bytes, {useOctetStream:true})",
        () => s.files.write('/home/user/g5/raw.bin', bytes, { useOctetStream: true }))
      const raw = one(exchanges(), 'POST', /^\/files\?path=%2Fhome%2Fuser%2Fg5%2Fraw\.bin/)
      assert.equal(raw.reqHeaders['content-type'], 'application/octet-stream')
      const back = await sdk("sbx.files.read('/home/user/g5/raw.bin', {format:'bytes'})",
        () => s.files.read('/home/user/g5/raw.bin', { format: 'bytes' }))
      assert.deepEqual([...back], [...bytes])

      const big = 'stream line\n'.repeat(20_000)
      const stream = new Blob([big]).stream()
      await sdk("sbx.files.write('/home/user/g5/stream.txt', <ReadableStream>)", () => s.files.write('/home/user/g5/stream.txt', stream))
      const st = await sdk("sbx.files.getInfo('/home/user/g5/stream.txt')", () => s.files.getInfo('/home/user/g5/stream.txt'))
      assert.equal(st.size, big.length)

      const gzStream = new Blob([big]).stream()
      await sdk("sbx.files.write('/home/user/g5/stream.gz.txt', <ReadableStream>, {gzip:true})",
        () => s.files.write('/home/user/g5/stream.gz.txt', gzStream, { gzip: true }))
      assert.equal(await sdk("sbx.files.read('/home/user/g5/stream.gz.txt')", () => s.files.read('/home/user/g5/stream.gz.txt')), big)
    })

    // ---------------------------------------------------------------- step 6
    step('step 6: files.read as text, bytes, blob and stream; gzip; empty file; missing → FileNotFoundError', async ({ sdk }) => {
      const s = shared()
      const content = 'line one\nline two — ünïcødé\n'
      await sdk("sbx.files.write('/home/user/r6.txt', content)", () => s.files.write('/home/user/r6.txt', content))
      assert.equal(await sdk("sbx.files.read('/home/user/r6.txt')", () => s.files.read('/home/user/r6.txt')), content)
      const bytes = await sdk("sbx.files.read('/home/user/r6.txt', {format:'bytes'})", () => s.files.read('/home/user/r6.txt', { format: 'bytes' }))
      assert.ok(bytes instanceof Uint8Array)
      assert.deepEqual([...bytes], [...enc.encode(content)])
      const blob = await sdk("sbx.files.read('/home/user/r6.txt', {format:'blob'})", () => s.files.read('/home/user/r6.txt', { format: 'blob' }))
      assert.equal(await blob.text(), content)
      const stream = await sdk("sbx.files.read('/home/user/r6.txt', {format:'stream'})", () => s.files.read('/home/user/r6.txt', { format: 'stream' }))
      assert.equal(await streamText(stream), content)
      assert.equal(await sdk("sbx.files.read('/home/user/r6.txt', {gzip:true})", () => s.files.read('/home/user/r6.txt', { gzip: true })), content)
      assert.equal(await sdk("sbx.files.read('r6.txt')", () => s.files.read('r6.txt')), content)

      await sdk("sbx.files.write('/home/user/empty6', '')", () => s.files.write('/home/user/empty6', ''))
      assert.equal(await sdk("sbx.files.read('/home/user/empty6')", () => s.files.read('/home/user/empty6')), '')

      const err = await rejects(sdk("sbx.files.read('/home/user/missing6')", () => s.files.read('/home/user/missing6')))
      assert.ok(err instanceof FileNotFoundError, `expected FileNotFoundError, got ${err?.name}: ${err?.message}`)
    })

    // ---------------------------------------------------------------- step 7
    step('step 7: files.makeDir (true, then false), list with depth, exists, getInfo', async ({ sdk }) => {
      const s = shared()
      assert.equal(await sdk("sbx.files.makeDir('/home/user/d7/sub')", () => s.files.makeDir('/home/user/d7/sub')), true)
      assert.equal(await sdk("sbx.files.makeDir('/home/user/d7/sub') again", () => s.files.makeDir('/home/user/d7/sub')), false)
      await sdk("sbx.files.write([d7/a.txt, d7/sub/b.txt])", () => s.files.write([
        { path: '/home/user/d7/a.txt', data: 'hello' }, { path: '/home/user/d7/sub/b.txt', data: 'bee' }]))

      const l1 = await sdk("sbx.files.list('/home/user/d7')", () => s.files.list('/home/user/d7'))
      assert.deepEqual(l1.map((e) => [e.name, e.type, e.path]).sort(),
        [['a.txt', 'file', '/home/user/d7/a.txt'], ['sub', 'dir', '/home/user/d7/sub']])
      const a = l1.find((e) => e.name === 'a.txt')
      assert.equal(a.size, 5)
      assert.ok(a.modifiedTime instanceof Date && !isNaN(a.modifiedTime))
      const l2 = await sdk("sbx.files.list('/home/user/d7', {depth: 2})", () => s.files.list('/home/user/d7', { depth: 2 }))
      assert.deepEqual(l2.map((e) => e.path).sort(), ['/home/user/d7/a.txt', '/home/user/d7/sub', '/home/user/d7/sub/b.txt'])

      assert.equal(await sdk("sbx.files.exists('/home/user/d7/a.txt')", () => s.files.exists('/home/user/d7/a.txt')), true)
      assert.equal(await sdk("sbx.files.exists('/home/user/d7/nope')", () => s.files.exists('/home/user/d7/nope')), false)

      const fi = await sdk("sbx.files.getInfo('/home/user/d7/a.txt')", () => s.files.getInfo('/home/user/d7/a.txt'))
      assert.equal(fi.name, 'a.txt')
      assert.equal(fi.type, 'file')
      assert.equal(fi.path, '/home/user/d7/a.txt')
      assert.equal(fi.size, 5)
      assert.match(fi.permissions, /^-[rwx-]{9}$/)
      assert.equal(fi.owner, 'user')
      assert.equal(fi.group, 'user')
      near(fi.modifiedTime, Date.now(), 10 * 60_000, 'modifiedTime')
      const di = await sdk("sbx.files.getInfo('/home/user/d7/sub')", () => s.files.getInfo('/home/user/d7/sub'))
      assert.equal(di.type, 'dir')
      const err = await rejects(sdk("sbx.files.getInfo('/home/user/d7/nope')", () => s.files.getInfo('/home/user/d7/nope')))
      assert.ok(err instanceof FileNotFoundError, `expected FileNotFoundError, got ${err?.name}: ${err?.message}`)
      const lerr = await rejects(sdk("sbx.files.list('/home/user/nodir7')", () => s.files.list('/home/user/nodir7')))
      assert.ok(lerr instanceof FileNotFoundError, `expected FileNotFoundError, got ${lerr?.name}: ${lerr?.message}`)
    })

    step('step 7: files.rename and files.remove', async ({ sdk }) => {
      const s = shared()
      await sdk("sbx.files.write('/home/user/r7/old.txt', 'moved')", () => s.files.write('/home/user/r7/old.txt', 'moved'))
      const e = await sdk("sbx.files.rename('/home/user/r7/old.txt', '/home/user/r7/new.txt')",
        () => s.files.rename('/home/user/r7/old.txt', '/home/user/r7/new.txt'))
      assert.equal(e.path, '/home/user/r7/new.txt')
      assert.equal(e.name, 'new.txt')
      assert.equal(await sdk("sbx.files.exists('/home/user/r7/old.txt')", () => s.files.exists('/home/user/r7/old.txt')), false)
      assert.equal(await sdk("sbx.files.read('/home/user/r7/new.txt')", () => s.files.read('/home/user/r7/new.txt')), 'moved')

      await sdk("sbx.files.remove('/home/user/r7/new.txt')", () => s.files.remove('/home/user/r7/new.txt'))
      assert.equal(await sdk("sbx.files.exists('/home/user/r7/new.txt')", () => s.files.exists('/home/user/r7/new.txt')), false)
      await sdk("sbx.files.makeDir('/home/user/r7/tree/deep')", () => s.files.makeDir('/home/user/r7/tree/deep'))
      await sdk("sbx.files.remove('/home/user/r7/tree')", () => s.files.remove('/home/user/r7/tree'))
      assert.equal(await sdk("sbx.files.exists('/home/user/r7/tree')", () => s.files.exists('/home/user/r7/tree')), false)
    })

    // ---------------------------------------------------------------- step 8
    step('step 8: background command: commands.list, kill → true, wait → CommandExitError -1', async ({ sdk }) => {
      const s = shared()
      const h = await sdk("sbx.commands.run('sleep 60', {background:true})", () => s.commands.run('sleep 60', { background: true }))
      try {
        assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
        const list = await sdk('sbx.commands.list()', () => s.commands.list())
        const p = list.find((x) => x.pid === h.pid)
        assert.ok(p, `commands.list() lacks pid ${h.pid}: ${JSON.stringify(list)}`)
        assert.equal(p.cmd, '/bin/bash')
        assert.deepEqual(p.args, ['-l', '-c', 'sleep 60'])

        assert.equal(await sdk('handle.kill()', () => h.kill()), true)
        const err = await rejects(sdk('handle.wait()', () => h.wait()))
        assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`)
        assert.equal(err.exitCode, -1)
        await waitFor(`pid ${h.pid} to leave commands.list()`,
          async () => !(await sdk('sbx.commands.list()', () => s.commands.list())).some((x) => x.pid === h.pid), { timeout: 5000 })
        assert.equal(await sdk('sbx.commands.kill(999999)', () => s.commands.kill(999999)), false)
      } finally {
        await s.commands.kill(h.pid).catch(() => {})
      }
    })

    step('step 8: background exit 7 → wait() throws CommandExitError 7', async ({ sdk }) => {
      const h = await sdk("sbx.commands.run('echo bye; sleep 0.3; exit 7', {background:true})",
        () => shared().commands.run('echo bye; sleep 0.3; exit 7', { background: true }))
      const err = await rejects(sdk('handle.wait()', () => h.wait()))
      assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`)
      assert.equal(err.exitCode, 7)
      assert.equal(err.stdout, 'bye\n')
    })

    step('step 8: stdin: sendStdin then closeStdin ({stdin:true}) ends `cat`', async ({ sdk }) => {
      const s = shared()
      const h = await sdk("sbx.commands.run('cat', {background:true, stdin:true})", () => s.commands.run('cat', { background: true, stdin: true }))
      try {
        await sdk("handle.sendStdin('hello ')", () => h.sendStdin('hello '))
        await sdk("sbx.commands.sendStdin(pid, 'world\\n')", () => s.commands.sendStdin(h.pid, 'world\n'))
        await sdk('handle.closeStdin()', () => h.closeStdin())
        const r = await sdk('handle.wait()', () => h.wait())
        assert.equal(r.exitCode, 0)
        assert.equal(r.stdout, 'hello world\n')
      } finally {
        await s.commands.kill(h.pid).catch(() => {})
      }
    })

    step('step 8: commands.connect(pid) from a second client (Sandbox.connect)', async ({ sdk }) => {
      const s = shared()
      const h = await sdk("sbx.commands.run('for i in $(seq 1 200); do echo tick $i; sleep 0.1; done', {background:true})",
        () => s.commands.run('for i in $(seq 1 200); do echo tick $i; sleep 0.1; done', { background: true }))
      try {
        const other = await sdk(`Sandbox.connect('${s.sandboxId}')`, () => Sandbox.connect(s.sandboxId))
        let seen = ''
        const h2 = await sdk(`other.commands.connect(${h.pid}, {onStdout})`,
          () => other.commands.connect(h.pid, { onStdout: (d) => { seen += d } }))
        assert.equal(h2.pid, h.pid)
        await waitFor('output through the reconnected handle', () => /tick \d+/.test(seen), { timeout: 10_000 })
        assert.equal(await sdk(`other.commands.kill(${h.pid})`, () => other.commands.kill(h.pid)), true)
        const err = await rejects(sdk('connected handle.wait()', () => h2.wait()))
        assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`)
        assert.equal(err.exitCode, -1)
        const err1 = await rejects(sdk('original handle.wait()', () => h.wait()))
        assert.equal(err1.exitCode, -1)
      } finally {
        await s.commands.kill(h.pid).catch(() => {})
      }
    })

    // ---------------------------------------------------------------- step 9
    step('step 9: setTimeout(5 s) → the sandbox is gone soon after its timeout (getInfo not found, isRunning false)', async ({ sdk, exchanges }) => {
      const short = janitor.track(await sdk('Sandbox.create({timeoutMs: 120000})', () => Sandbox.create({ metadata: { ...META, role: 'short' }, timeoutMs: 120_000 })))
      const t0 = Date.now()
      await sdk('short.setTimeout(5000)', () => short.setTimeout(5000))
      const t1 = Date.now()
      const ex = one(exchanges(), 'POST', new RegExp(`^/sandboxes/${short.sandboxId}/timeout$`))
      assert.deepEqual(jsonBody(ex, 'req'), { timeout: 5 })
      assert.equal(ex.status, 204)
      const info = await sdk('short.getInfo()', () => short.getInfo())
      // The daemon sets endAt while handling the call: now + 5 s, some time
      // between t0 and t1 (1 s of slack for a time kept in whole seconds).
      between(info.endAt, t0 + 5000 - 1000, t1 + 5000 + 1000, 'endAt after setTimeout(5000)')
      assert.equal(await sdk('short.isRunning()', () => short.isRunning()), true, 'the sandbox must still run before its timeout')

      // The reaper removes it at its own pace, later still on a loaded
      // machine: poll for its end instead of sleeping a fixed time. A
      // different error (a 500, say) is retried and named if it lasts.
      const err = await waitFor('the sandbox to be gone after its 5 s timeout (Sandbox.getInfo → SandboxNotFoundError)', async () => {
        try {
          await sdk(`Sandbox.getInfo('${short.sandboxId}') while waiting for the expiry`, () => Sandbox.getInfo(short.sandboxId))
          return false
        } catch (e) {
          if (e instanceof SandboxNotFoundError) return e
          throw new Error(`expected SandboxNotFoundError, got ${e?.name}: ${e?.message}`)
        }
      }, { timeout: 60_000, interval: 500 })
      const goneAt = Date.now()
      assert.ok(err instanceof SandboxNotFoundError, `expected SandboxNotFoundError, got ${err?.name}: ${err?.message}`)
      // Seen gone at goneAt means removed by then: not before its timeout.
      assert.ok(goneAt >= t0 + 5000 - 1000, `the sandbox was gone ${goneAt - t0} ms after setTimeout(5000): before its timeout`)
      assert.equal(await sdk('short.isRunning() after expiry', () => short.isRunning()), false)
      assert.equal(matching(exchanges(), 'GET', /^\/health$/).at(-1).status, 502)

      const nf = await rejects(sdk(`Sandbox.setTimeout('${UNKNOWN_ID}', 1000)`, () => Sandbox.setTimeout(UNKNOWN_ID, 1000)))
      assert.ok(nf instanceof SandboxNotFoundError, `expected SandboxNotFoundError, got ${nf?.name}: ${nf?.message}`)
    }, { timeout: 90_000 })

    step('step 9: setTimeout extends a running sandbox (endAt = now + timeout)', async ({ sdk }) => {
      const s = shared()
      const t0 = Date.now()
      await sdk('sbx.setTimeout(200000)', () => s.setTimeout(200_000))
      const t1 = Date.now()
      const info = await sdk('sbx.getInfo()', () => s.getInfo())
      between(info.endAt, t0 + 200_000 - 1000, t1 + 200_000 + 1000, 'endAt after setTimeout(200000)')
    })

    // --------------------------------------------------------------- step 10
    step('step 10: Sandbox.list filters by metadata (also special characters) and state', async ({ sdk, exchanges }) => {
      const s = shared()
      extras = await sdk('Sandbox.create() ×2 with metadata', () => Promise.all([
        Sandbox.create({ metadata: { ...META, role: 'extra1', 'k&': 'v=1 b/ä' }, timeoutMs: 120_000 }).then((x) => janitor.track(x)),
        Sandbox.create({ metadata: { ...META, role: 'extra2' }, timeoutMs: 120_000 }).then((x) => janitor.track(x)),
      ]))
      const ours = [s.sandboxId, ...extras.map((x) => x.sandboxId)].sort()

      const all = await sdk('Sandbox.list({query:{metadata:{run, v}}}).nextItems()',
        () => Sandbox.list({ query: { metadata: { run: RUN, v: version } } }).nextItems())
      assert.deepEqual(all.map((x) => x.sandboxId).sort(), ours)
      for (const item of all) {
        assert.equal(item.state, 'running')
        assert.ok([item.templateId, item.name].includes('base'), `template of ${JSON.stringify(item)}`)
        assert.equal(item.metadata.run, RUN)
        assert.equal(item.envdVersion, ENVD_VERSION)
        assert.ok(item.startedAt instanceof Date && !isNaN(item.startedAt))
        assert.ok(item.endAt > item.startedAt)
        assert.ok(item.cpuCount > 0 && item.memoryMB > 0)
      }

      const special = await sdk("Sandbox.list({query:{metadata:{'k&':'v=1 b/ä', run}}}).nextItems()",
        () => Sandbox.list({ query: { metadata: { 'k&': 'v=1 b/ä', run: RUN } } }).nextItems())
      assert.deepEqual(special.map((x) => x.sandboxId), [extras[0].sandboxId])
      assert.equal(special[0].metadata['k&'], 'v=1 b/ä')

      const running = await sdk("Sandbox.list({query:{metadata, state:['running']}}).nextItems()",
        () => Sandbox.list({ query: { metadata: { run: RUN, v: version }, state: ['running'] } }).nextItems())
      assert.deepEqual(running.map((x) => x.sandboxId).sort(), ours)
      const paused = await sdk("Sandbox.list({query:{metadata, state:['paused']}}).nextItems()",
        () => Sandbox.list({ query: { metadata: { run: RUN, v: version }, state: ['paused'] } }).nextItems())
      assert.deepEqual(paused, [])
      const ex = one(exchanges(), 'GET', /^\/v2\/sandboxes\?.*state=paused/)
      assert.equal(ex.status, 200)
    })

    step('step 10: Sandbox.list paging: limit, nextItems, hasNext', async ({ sdk }) => {
      const ours = [shared().sandboxId, ...extras.map((x) => x.sandboxId)].sort()
      assert.equal(ours.length, 3, 'needs the sandboxes of the previous step')
      const p = Sandbox.list({ query: { metadata: { run: RUN, v: version } }, limit: 1 })
      assert.equal(p.hasNext, true)
      const pages = []
      while (p.hasNext && pages.length < 10) {
        pages.push(await sdk(`paginator(limit 1).nextItems() #${pages.length + 1}`, () => p.nextItems()))
      }
      assert.deepEqual(pages.flat().map((x) => x.sandboxId).sort(), ours)
      assert.deepEqual(pages.map((x) => x.length), [1, 1, 1], 'three pages of one; X-Next-Token only while another page exists')

      const q = Sandbox.list({ query: { metadata: { run: RUN, v: version } }, limit: 2 })
      const first = await sdk('paginator(limit 2).nextItems() #1', () => q.nextItems())
      assert.equal(first.length, 2)
      assert.equal(q.hasNext, true)
      const second = await sdk('paginator(limit 2).nextItems() #2', () => q.nextItems())
      assert.equal(second.length, 1)
      assert.equal(q.hasNext, false)
      assert.deepEqual([...first, ...second].map((x) => x.sandboxId).sort(), ours)
    })

    // --------------------------------------------------------------- step 11
    step('step 11: getInfo (instance and static) → SandboxDetail', async ({ sdk }) => {
      const s = shared()
      const info = await sdk('sbx.getInfo()', () => s.getInfo())
      assert.equal(info.sandboxId, s.sandboxId)
      assert.ok([info.templateId, info.name].includes('base'), `templateId ${info.templateId}, name ${info.name}`)
      assert.deepEqual(info.metadata, META)
      assert.equal(info.state, 'running')
      assert.equal(info.envdVersion, ENVD_VERSION)
      assert.ok(info.startedAt instanceof Date && info.startedAt.getTime() <= Date.now() + 1000)
      assert.ok(info.endAt.getTime() > Date.now(), `endAt ${info.endAt.toISOString()} is in the past`)
      assert.ok(info.cpuCount > 0 && info.memoryMB > 0)
      const again = await sdk(`Sandbox.getInfo('${s.sandboxId}')`, () => Sandbox.getInfo(s.sandboxId))
      assert.equal(again.sandboxId, s.sandboxId)
      assert.deepEqual(again.metadata, META)
    })

    // --------------------------------------------------------------- step 12
    step('step 12: kill → true, then false; isRunning false (502); getInfo not found; gone from list', async ({ sdk, exchanges }) => {
      assert.ok(extras[1], 'needs the extra sandbox of step 10')
      const k = extras[1]
      assert.equal(await sdk('k.isRunning()', () => k.isRunning()), true)
      assert.equal(await sdk('k.kill()', () => k.kill()), true)
      const del = one(exchanges(), 'DELETE', new RegExp(`^/sandboxes/${k.sandboxId}$`))
      assert.equal(del.status, 204)
      assert.equal(await sdk('k.kill() again', () => k.kill()), false)
      assert.equal(await sdk(`Sandbox.kill('${k.sandboxId}')`, () => Sandbox.kill(k.sandboxId)), false)
      const del2 = matching(exchanges(), 'DELETE', new RegExp(`^/sandboxes/${k.sandboxId}$`)).at(-1)
      assert.equal(del2.status, 404)
      assert.equal(jsonBody(del2).code, 404)

      assert.equal(await sdk('k.isRunning() after kill', () => k.isRunning()), false)
      const health = matching(exchanges(), 'GET', /^\/health$/).at(-1)
      assert.equal(health.status, 502)
      const err = await rejects(sdk(`Sandbox.getInfo('${k.sandboxId}')`, () => Sandbox.getInfo(k.sandboxId)))
      assert.ok(err instanceof SandboxNotFoundError, `expected SandboxNotFoundError, got ${err?.name}: ${err?.message}`)
      const listed = await sdk('Sandbox.list({query:{metadata:{run, v}}}).nextItems()',
        () => Sandbox.list({ query: { metadata: { run: RUN, v: version } } }).nextItems())
      assert.ok(!listed.some((x) => x.sandboxId === k.sandboxId), 'a killed sandbox is still listed')
    })

    // --------------------------------------------------------------- step 13
    step(`step 13: Sandbox.connect(id) via ${usesV2 ? 'POST /v2/sandboxes/{id}/connect' : 'POST /sandboxes/{id}/connect'}`, async ({ sdk, exchanges }) => {
      const s = shared()
      const before = await sdk('sbx.getInfo()', () => s.getInfo())
      const c = await sdk(`Sandbox.connect('${s.sandboxId}', {timeoutMs: 10000})`, () => Sandbox.connect(s.sandboxId, { timeoutMs: 10_000 }))
      assert.equal(c.sandboxId, s.sandboxId)
      const ex = one(exchanges(), 'POST', connectPath(s.sandboxId))
      assert.equal(ex.status, 200, 'connecting to a running sandbox answers 200')
      const res = jsonBody(ex)
      assert.equal(res.sandboxID, s.sandboxId)
      assert.equal(res.envdAccessToken, s.envdAccessToken, 'connect must return the same envdAccessToken as create')
      assert.equal(res.domain, s.sandboxDomain)
      assert.equal(c.envdAccessToken, s.envdAccessToken)

      const r = await sdk("connected.commands.run('cat /home/user/d5/a.txt')", () => c.commands.run('cat /home/user/d5/a.txt'))
      assert.equal(r.stdout, 'hi')
      const after = await sdk('sbx.getInfo()', () => s.getInfo())
      assert.ok(after.endAt.getTime() >= before.endAt.getTime() - 1000,
        `connect shortened the TTL: endAt ${before.endAt.toISOString()} → ${after.endAt.toISOString()}`)

      const err = await rejects(sdk(`Sandbox.connect('${UNKNOWN_ID}')`, () => Sandbox.connect(UNKNOWN_ID)))
      assert.ok(err instanceof NotFoundError, `expected SandboxNotFoundError, got ${err?.name}: ${err?.message}`)
    })

    // --------------------------------------------------------------- step 14
    step('step 14: getHost(8000): python3 -m http.server reachable by Host and by routing headers', async ({ sdk }) => {
      const s = shared()
      await sdk("sbx.files.write('/home/user/www/index.html', ...)", () => s.files.write('/home/user/www/index.html', `hello from ${s.sandboxId}\n`))
      let serverErr = ''
      const srv = await sdk("sbx.commands.run('python3 -m http.server 8000 --bind 0.0.0.0 --directory /home/user/www', {background:true, timeoutMs:0, onStderr})",
        () => s.commands.run('python3 -m http.server 8000 --bind 0.0.0.0 --directory /home/user/www',
          { background: true, timeoutMs: 0, onStderr: (d) => { serverErr = (serverErr + d).slice(-1500) } }))
      try {
        const host = s.getHost(8000)
        assert.equal(host, `8000-${s.sandboxId}.${s.sandboxDomain}`)
        const viaHeaders = await waitFor('the http.server to answer through E2b-Sandbox-Id/E2b-Sandbox-Port: 8000', async () => {
          const r = await httpRequest({ path: '/index.html', headers: routing(8000) })
          return r.status === 200 && r
        }, { timeout: 15_000, interval: 250 })
        assert.equal(viaHeaders.body, `hello from ${s.sandboxId}\n`)
        const viaHost = await httpRequest({ path: '/index.html', headers: { Host: host } })
        assert.equal(viaHost.status, 200, `GET /index.html with Host ${host}: ${viaHost.status} ${viaHost.body}`)
        assert.equal(viaHost.body, `hello from ${s.sandboxId}\n`)
        const closed = await httpRequest({ path: '/', headers: { Host: s.getHost(8001) } })
        assert.equal(closed.status, 502, `a closed port answers 502 (got ${closed.status} ${closed.body})`)
      } catch (e) {
        e.message += `\nthe http.server's stderr (last 1500 chars): ${serverErr}`
        throw e
      } finally {
        await srv.kill().catch(() => {})
      }
    }, { timeout: 40_000 })

    step('step 14: getHost(port) routing to a single-threaded HTTP server (by Host and by headers)', async ({ sdk }) => {
      // python3 -m http.server starts a thread per request; this server does
      // not, so it tells routing problems apart from thread problems.
      const s = shared()
      const code = 'import http.server, functools; h = functools.partial(http.server.SimpleHTTPRequestHandler, directory="/home/user/www"); http.server.HTTPServer(("0.0.0.0", 8002), h).serve_forever()'
      await sdk("sbx.files.write('/home/user/www/index.html', ...)", () => s.files.write('/home/user/www/index.html', `hello from ${s.sandboxId}\n`))
      const srv = await sdk("sbx.commands.run('python3 -c <single-threaded HTTPServer on 8002>', {background:true, timeoutMs:0})",
        () => s.commands.run(`python3 -c '${code}'`, { background: true, timeoutMs: 0 }))
      try {
        const host = s.getHost(8002)
        assert.equal(host, `8002-${s.sandboxId}.${s.sandboxDomain}`)
        const viaHeaders = await waitFor('the server to answer through E2b-Sandbox-Id/E2b-Sandbox-Port: 8002', async () => {
          const r = await httpRequest({ path: '/index.html', headers: routing(8002) })
          return r.status === 200 && r
        }, { timeout: 15_000, interval: 250 })
        assert.equal(viaHeaders.body, `hello from ${s.sandboxId}\n`)
        const viaHost = await httpRequest({ path: '/index.html', headers: { Host: host } })
        assert.equal(viaHost.status, 200, `GET /index.html with Host ${host}: ${viaHost.status} ${viaHost.body}`)
        assert.equal(viaHost.body, `hello from ${s.sandboxId}\n`)
      } finally {
        await srv.kill().catch(() => {})
      }
    }, { timeout: 40_000 })

    // --------------------------------------------------------------- step 15
    step('step 15: pause → true, again → false; listed paused, isRunning false (502); Sandbox.connect resumes (201) with files and a background process', async ({ sdk, exchanges }) => {
      const p = janitor.track(await sdk('Sandbox.create({timeoutMs: 120000})', () => Sandbox.create({ metadata: { ...META, role: 'pause' }, timeoutMs: 120_000 })))
      await sdk("p.files.write('/home/user/kept.txt', 'kept')", () => p.files.write('/home/user/kept.txt', 'kept'))
      // The counter replaces its file by a rename, so a read never sees it
      // truncated and empty (`echo $i > count` would, between truncate and write).
      const counter = 'i=0; while :; do i=$((i+1)); echo $i > /home/user/count.tmp; mv -f /home/user/count.tmp /home/user/count; echo tick $i; sleep 0.2; done'
      const bg = await sdk('p.commands.run(<counter>, {background:true, timeoutMs:0})', () => p.commands.run(counter, { background: true, timeoutMs: 0 }))
      bg.wait().catch(() => {}) // its stream breaks at the pause; the process does not
      // The count, or null when the file holds no count: callers poll with
      // waitFor, so null (and a missing file, which throws) means read again.
      const count = async (s) => {
        const text = (await s.files.read('/home/user/count')).trim()
        return /^[1-9]\d*$/.test(text) ? Number(text) : null
      }
      const before = await waitFor('the counter to count', async () => { const n = await count(p); return n > 1 && n }, { timeout: 20_000 })

      assert.equal(await sdk('p.pause()', () => p.pause()), true)
      const pausePath = new RegExp(`^/sandboxes/${p.sandboxId}/pause$`)
      assert.equal(one(exchanges(), 'POST', pausePath).status, 204)
      assert.equal(await sdk('p.pause() again', () => p.pause()), false, 'a second pause answers 409 → false')
      const again = matching(exchanges(), 'POST', pausePath)
      assert.equal(again.length, 2)
      assert.equal(again[1].status, 409)
      assert.equal(jsonBody(again[1]).code, 409)

      const listed = await sdk("Sandbox.list({query:{metadata:{run, role:'pause'}}}).nextItems()",
        () => Sandbox.list({ query: { metadata: { run: RUN, v: version, role: 'pause' } } }).nextItems())
      assert.deepEqual(listed.map((x) => [x.sandboxId, x.state]), [[p.sandboxId, 'paused']])
      const info = await sdk('p.getInfo()', () => p.getInfo())
      assert.equal(info.state, 'paused')
      assert.equal(await sdk('p.isRunning()', () => p.isRunning()), false)
      assert.equal(matching(exchanges(), 'GET', /^\/health$/).at(-1).status, 502)

      const c = await sdk(`Sandbox.connect('${p.sandboxId}')`, () => Sandbox.connect(p.sandboxId))
      const ex = one(exchanges(), 'POST', connectPath(p.sandboxId))
      assert.equal(ex.status, 201, 'connecting to a paused sandbox resumes it and answers 201')
      assert.equal(jsonBody(ex).envdAccessToken, p.envdAccessToken, 'resume keeps the envdAccessToken')
      assert.equal(await sdk('connected.isRunning()', () => c.isRunning()), true)
      assert.equal((await sdk('connected.getInfo()', () => c.getInfo())).state, 'running')
      assert.equal(await sdk("connected.files.read('/home/user/kept.txt')", () => c.files.read('/home/user/kept.txt')), 'kept')
      const resumedAt = await waitFor('a count to read after resume', () => count(c))
      assert.ok(resumedAt >= before, `the counter went back from ${before} to ${resumedAt}`)
      await waitFor('the background process to go on counting after resume', async () => (await count(c)) > resumedAt + 2, { timeout: 20_000 })
      let seen = ''
      const h2 = await sdk(`connected.commands.connect(${bg.pid}, {onStdout})`, () => c.commands.connect(bg.pid, { onStdout: (d) => { seen += d } }))
      assert.equal(h2.pid, bg.pid)
      await waitFor('output of the re-attached background process', () => /tick \d+/.test(seen), { timeout: 10_000 })
      assert.equal(await sdk(`connected.commands.kill(${bg.pid})`, () => c.commands.kill(bg.pid)), true)
      await h2.wait().catch(() => {})
    }, { timeout: 90_000 })

    // ------------------------------------------------------ step 17 (state)
    step('step 17: createSnapshot, listSnapshots, Sandbox.create from the snapshot, fork, deleteSnapshot', async ({ sdk, exchanges }) => {
      const o = janitor.track(await sdk('Sandbox.create({timeoutMs: 120000})', () => Sandbox.create({ metadata: { ...META, role: 'snap' }, timeoutMs: 120_000 })))
      await sdk("o.files.write('/home/user/snap.txt', 'before')", () => o.files.write('/home/user/snap.txt', 'before'))
      const info = await sdk("o.createSnapshot({name})", () => o.createSnapshot({ name: `snap-${RUN}-${version.replaceAll('.', '')}` }))
      assert.ok(info.snapshotId, 'a snapshot ID')
      assert.equal(one(exchanges(), 'POST', new RegExp(`^/sandboxes/${o.sandboxId}/snapshots$`)).status, 201)
      const listed = await sdk(`Sandbox.listSnapshots({sandboxId}).nextItems()`, () => Sandbox.listSnapshots({ sandboxId: o.sandboxId }).nextItems())
      assert.ok(listed.some((x) => x.snapshotId === info.snapshotId), `listed: ${JSON.stringify(listed)}`)
      // The original goes on and changes; the snapshot keeps what it had.
      await sdk("o.files.write('/home/user/snap.txt', 'after')", () => o.files.write('/home/user/snap.txt', 'after'))
      const fromSnap = janitor.track(await sdk(`Sandbox.create('${info.snapshotId}')`, () => Sandbox.create(info.snapshotId, { timeoutMs: 60_000 })))
      assert.equal(await sdk("fromSnap.files.read('/home/user/snap.txt')", () => fromSnap.files.read('/home/user/snap.txt')), 'before')
      const forks = await sdk('o.fork({count: 2})', () => o.fork({ count: 2, timeoutMs: 60_000 }))
      assert.equal(forks.length, 2)
      for (const f of forks) {
        assert.ok(!(f instanceof Error), `fork failed: ${f}`)
        janitor.track(f)
        assert.notEqual(f.sandboxId, o.sandboxId)
        assert.equal(await sdk('fork.files.read(snap.txt)', () => f.files.read('/home/user/snap.txt')), 'after')
      }
      await sdk("forks[0].files.write('/home/user/snap.txt', 'fork0')", () => forks[0].files.write('/home/user/snap.txt', 'fork0'))
      assert.equal(await sdk('forks[1].files.read(snap.txt)', () => forks[1].files.read('/home/user/snap.txt')), 'after', 'a fork\'s change is its own')
      assert.equal(await sdk('o.files.read(snap.txt)', () => o.files.read('/home/user/snap.txt')), 'after')
      assert.equal(await sdk(`Sandbox.deleteSnapshot('${info.snapshotId}')`, () => Sandbox.deleteSnapshot(info.snapshotId)), true)
      assert.equal(await sdk('Sandbox.deleteSnapshot again', () => Sandbox.deleteSnapshot(info.snapshotId)), false)
    }, { timeout: 90_000 })

    // --------------------------------------------------------------- step 17
    step('step 17: files.watchDir delivers create, write, rename and remove events', async ({ sdk }) => {
      const s = shared()
      await sdk("sbx.files.makeDir('/home/user/w17')", () => s.files.makeDir('/home/user/w17'))
      const events = []
      const w = await sdk("sbx.files.watchDir('/home/user/w17', onEvent)", () => s.files.watchDir('/home/user/w17', (e) => events.push(e)))
      try {
        const has = (type, name) => events.some((e) => e.type === type && e.name === name)
        await sdk("sbx.files.write('/home/user/w17/a.txt', 'x')", () => s.files.write('/home/user/w17/a.txt', 'x'))
        await waitFor('create + write events for a.txt', () => has(FilesystemEventType.CREATE, 'a.txt') && has(FilesystemEventType.WRITE, 'a.txt'), { timeout: 5000 })
        await sdk("sbx.files.rename('/home/user/w17/a.txt', '/home/user/w17/b.txt')", () => s.files.rename('/home/user/w17/a.txt', '/home/user/w17/b.txt'))
        await waitFor('a rename event for a.txt', () => has(FilesystemEventType.RENAME, 'a.txt'), { timeout: 5000 })
        await sdk("sbx.files.remove('/home/user/w17/b.txt')", () => s.files.remove('/home/user/w17/b.txt'))
        await waitFor('a remove event for b.txt', () => has(FilesystemEventType.REMOVE, 'b.txt'), { timeout: 5000 })
      } catch (e) {
        e.message += `\nevents received: ${JSON.stringify(events)}`
        throw e
      } finally {
        await w.stop()
      }
    })

    step('step 17: files.watchDir({recursive:true}) reports nested paths relative to the watched dir', async ({ sdk }) => {
      const s = shared()
      await sdk("sbx.files.makeDir('/home/user/wr17/sub')", () => s.files.makeDir('/home/user/wr17/sub'))
      const events = []
      const w = await sdk("sbx.files.watchDir('/home/user/wr17', onEvent, {recursive:true})",
        () => s.files.watchDir('/home/user/wr17', (e) => events.push(e), { recursive: true }))
      try {
        await sdk("sbx.files.write('/home/user/wr17/sub/x.txt', 'x')", () => s.files.write('/home/user/wr17/sub/x.txt', 'x'))
        await waitFor('a create event for sub/x.txt', () => events.some((e) => e.type === FilesystemEventType.CREATE && e.name === 'sub/x.txt'), { timeout: 5000 })
        await sdk("sbx.commands.run('rm /home/user/wr17/sub/x.txt')", () => s.commands.run('rm /home/user/wr17/sub/x.txt'))
        await waitFor('a remove event for sub/x.txt', () => events.some((e) => e.type === FilesystemEventType.REMOVE && e.name === 'sub/x.txt'), { timeout: 5000 })
      } catch (e) {
        e.message += `\nevents received: ${JSON.stringify(events)}`
        throw e
      } finally {
        await w.stop()
      }
    })

    step('step 17: pty.create, sendInput, resize, onData', async ({ sdk }) => {
      const s = shared()
      let out = ''
      const td = new TextDecoder()
      const pty = await sdk('sbx.pty.create({cols: 80, rows: 24, onData})',
        () => s.pty.create({ cols: 80, rows: 24, onData: (d) => { out += td.decode(d, { stream: true }) } }))
      try {
        await sdk("sbx.pty.sendInput(pid, 'echo PTY_$((6*7)); stty size\\n')", () => s.pty.sendInput(pty.pid, enc.encode('echo PTY_$((6*7)); stty size\n')))
        await waitFor('PTY_42 and "24 80" on the terminal', () => out.includes('PTY_42') && out.includes('24 80'), { timeout: 10_000 })
        await sdk('sbx.pty.resize(pid, {cols: 100, rows: 40})', () => s.pty.resize(pty.pid, { cols: 100, rows: 40 }))
        await sdk("sbx.pty.sendInput(pid, 'stty size; tty\\n')", () => s.pty.sendInput(pty.pid, enc.encode('stty size; tty\n')))
        await waitFor('"40 100" and a /dev/pts tty', () => out.includes('40 100') && /\/dev\/pts\/\d+/.test(out), { timeout: 10_000 })
        await sdk("sbx.pty.sendInput(pid, 'exit 0\\n')", () => s.pty.sendInput(pty.pid, enc.encode('exit 0\n')))
        const r = await sdk('pty.wait()', () => pty.wait())
        assert.equal(r.exitCode, 0)
      } catch (e) {
        e.message += `\nterminal output: ${JSON.stringify(out.slice(-2000))}`
        throw e
      } finally {
        await s.pty.kill(pty.pid).catch(() => {})
      }
    })

    step('step 17: uploadUrl/downloadUrl: signed URLs work with plain fetch, a bad signature is refused', async ({ sdk }) => {
      const s = shared()
      const path = '/home/user/signed17/u.txt'
      const up = await sdk(`sbx.uploadUrl('${path}')`, () => s.uploadUrl(path))
      assert.match(up, /[?&]signature=v1_/)
      // E2B_SANDBOX_URL is a plain address, so (like every SDK request) the
      // request is routed by the E2b-Sandbox-* headers; no X-Access-Token.
      const form = new FormData()
      form.append('file', new Blob(['signed upload']), path)
      const res = await fetch(up, { method: 'POST', body: form, headers: routing() })
      assert.equal(res.status, 200, `POST uploadUrl: ${res.status} ${await res.text()}`)

      const down = await sdk(`sbx.downloadUrl('${path}')`, () => s.downloadUrl(path))
      assert.match(down, /[?&]signature=v1_/)
      const got = await fetch(down, { headers: routing() })
      assert.equal(got.status, 200)
      assert.equal(await got.text(), 'signed upload')
      // The same download URL by Host <49983-id>.<domain>, as in production.
      const u = new URL(down)
      const byHost = await httpRequest({ path: u.pathname + u.search, headers: { Host: `49983-${s.sandboxId}.${s.sandboxDomain}` } })
      assert.equal(byHost.status, 200)
      assert.equal(byHost.body, 'signed upload')

      const exp = await sdk(`sbx.downloadUrl('${path}', {useSignatureExpiration: 60})`, () => s.downloadUrl(path, { useSignatureExpiration: 60 }))
      assert.match(exp, /[?&]signature_expiration=\d+/)
      const gotExp = await fetch(exp, { headers: routing() })
      assert.equal(gotExp.status, 200)

      const bad = new URL(down)
      bad.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
      const refused = await fetch(bad, { headers: routing() })
      assert.equal(refused.status, 401, 'a wrong signature must be refused')
      const unsigned = new URL(down)
      unsigned.searchParams.delete('signature')
      const refused2 = await fetch(unsigned, { headers: routing() })
      assert.equal(refused2.status, 401, 'no signature and no X-Access-Token must be refused')
      const wrongOp = await fetch(up, { headers: routing() }) // the write signature used for a read
      assert.equal(wrongOp.status, 401, 'a write signature must not allow a read')
    })

    step('step 17: getMetrics → SandboxMetric[] (CPU, memory, disk of the sandbox); start/end window; unknown → SandboxNotFoundError', async ({ sdk, exchanges }) => {
      const s = shared()
      const MiB = 1024 * 1024
      const metricsPath = new RegExp(`^/sandboxes/${s.sandboxId}/metrics(\\?|$)`)
      const show = (ms) => JSON.stringify(ms.map((m) => ({ ...m, timestamp: m.timestamp?.toISOString?.() ?? String(m.timestamp) })))
      const info = await sdk('sbx.getInfo()', () => s.getInfo())
      const before = await sdk('sbx.getMetrics() before', () => s.getMetrics())
      assert.ok(before.length > 0, 'a running sandbox answers with at least a sample of the present')
      const diskBefore = before.at(-1).diskUsed

      await sdk("sbx.commands.run('head -c 8388608 /dev/urandom > /home/user/metrics.bin')",
        () => s.commands.run('head -c 8388608 /dev/urandom > /home/user/metrics.bin'))
      const busy = "timeout 20 sh -c 'while :; do :; done'"
      const h = await sdk(`sbx.commands.run("${busy}", {background:true})`, () => s.commands.run(busy, { background: true }))
      const busySince = Date.now()
      let ms = []
      try {
        // cpuUsedPct covers the time since the previous sample; cella takes
        // one on request when its newest is over a second old. Only a sample
        // taken after the loop started counts (an earlier one may be the
        // first sample, which covers the boot).
        await waitFor('a sample taken during the busy loop with cpuUsedPct > 5', async () => {
          ms = await sdk('sbx.getMetrics()', () => s.getMetrics())
          const last = ms.at(-1)
          return last && last.timestamp.getTime() > busySince && last.cpuUsedPct > 5
        }, { timeout: 30_000, interval: 500 })
      } catch (e) {
        e.message += `\nlast getMetrics(): ${show(ms.slice(-5))}`
        throw e
      } finally {
        await s.commands.kill(h.pid).catch(() => {})
        await h.wait().catch(() => {})
      }
      try {
        assert.ok(ms.length > 0)
        // The shared sandbox has the default memory: 512 MiB.
        assert.equal(info.memoryMB, 512)
        let prev = -Infinity
        for (const m of ms) {
          assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp), `timestamp is not a valid Date: ${m.timestamp}`)
          assert.ok(m.timestamp.getTime() >= prev, 'timestamps go oldest first')
          prev = m.timestamp.getTime()
          assert.ok(Number.isInteger(m.cpuCount) && m.cpuCount >= 1, `cpuCount ${m.cpuCount}`)
          assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`)
          assert.equal(m.memTotal, 512 * MiB, 'memTotal is the sandbox memory limit')
          assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `memUsed ${m.memUsed}`)
          assert.ok(m.memCache >= 0, `memCache ${m.memCache}`)
          assert.ok(m.diskTotal > 0, `diskTotal ${m.diskTotal}`)
          assert.ok(m.diskUsed >= 0 && m.diskUsed <= m.diskTotal, `diskUsed ${m.diskUsed} of ${m.diskTotal}`)
        }
        assert.equal(ms.at(-1).cpuCount, info.cpuCount, 'cpuCount is the sandbox\'s (getInfo)')
        assert.ok(ms.at(-1).timestamp.getTime() <= Date.now() + 1000, `the newest sample ${ms.at(-1).timestamp.toISOString()} is in the future`)
        assert.ok(ms.at(-1).diskUsed >= 8 * MiB, `diskUsed ${ms.at(-1).diskUsed} after writing 8 MiB`)
        assert.ok(ms.at(-1).diskUsed - diskBefore >= 8 * MiB, `diskUsed went from ${diskBefore} to ${ms.at(-1).diskUsed} for an 8 MiB file`)
      } catch (e) {
        e.message += `\ngetMetrics(): ${show(ms.slice(-10))}`
        throw e
      }

      // A window in the future: nothing. A window over the past minute: the samples.
      const now = Date.now()
      const future = await sdk('Sandbox.getMetrics(id, {start: now+1h, end: now+2h})',
        () => Sandbox.getMetrics(s.sandboxId, { start: new Date(now + 3_600_000), end: new Date(now + 7_200_000) }))
      assert.deepEqual(future, [])
      const fex = one(exchanges(), 'GET', metricsPath)
      assert.equal(fex.status, 200)
      const q = new URL(fex.url, 'http://x').searchParams
      assert.equal(q.get('start'), String(Math.round((now + 3_600_000) / 1000)), `query ${fex.url}`)
      assert.equal(q.get('end'), String(Math.round((now + 7_200_000) / 1000)), `query ${fex.url}`)
      assert.deepEqual(jsonBody(fex), [])
      const past = await sdk('Sandbox.getMetrics(id, {start: now-60s, end: now})',
        () => Sandbox.getMetrics(s.sandboxId, { start: new Date(now - 60_000), end: new Date(now) }))
      assert.ok(past.length > 0, 'the past minute has samples')
      for (const m of past) {
        assert.ok(m.timestamp.getTime() >= now - 61_000 && m.timestamp.getTime() <= now + 1500,
          `sample at ${m.timestamp.toISOString()} is outside the window`)
      }

      const nf = await rejects(sdk(`Sandbox.getMetrics('${UNKNOWN_ID}')`, () => Sandbox.getMetrics(UNKNOWN_ID)))
      assert.ok(nf instanceof SandboxNotFoundError, `expected SandboxNotFoundError, got ${nf?.name}: ${nf?.message}`)
      const nex = one(exchanges(), 'GET', new RegExp(`^/sandboxes/${UNKNOWN_ID}/metrics`))
      assert.equal(nex.status, 404)
      assert.equal(jsonBody(nex).code, 404)
      await s.files.remove('/home/user/metrics.bin').catch(() => {})
    }, { timeout: 60_000 })

    // ------------------------------------------------------------------ end
    step('step 12: the shared sandbox is killed at the end (kill → true)', async ({ sdk }) => {
      const s = shared()
      assert.equal(await sdk('sbx.kill()', () => s.kill()), true)
      assert.equal(await sdk('sbx.isRunning()', () => s.isRunning()), false)
    })
  })
}

after(closeProxy)
