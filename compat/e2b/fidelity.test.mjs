// E2B fidelity, round two (issue 13): the protocol details other E2B
// clients (the Python SDK above all) depend on, and the envd 0.6.x features
// cella reports, through the real e2b@2.51.0 SDK or, where the JS SDK would
// hide the difference (its own client-side deadline), at the Connect level.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import {
  step, rejects, waitFor, sandboxJanitor, closeProxy, proxy, httpRequest, DAEMON_URL, ADMIN_KEY,
} from './lib/harness.mjs'

const e2b = await import('e2b-2.51.0')
const { Sandbox, TimeoutError, FilesystemEventType } = e2b
// 2.50.0 is the newest SDK that still sends E2B's `secure` (v1 create).
const e2b250 = await import('e2b-2.50.0')
const RUN = `f${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`

// One Connect server-streaming call as a plain HTTP client makes it
// (through the logging proxy): the frames of the answer ({flags, json}).
function connectStream (sbx, procedure, msg, headers = {}) {
  const body = Buffer.from(JSON.stringify(msg))
  const env = Buffer.alloc(5 + body.length)
  env.writeUInt32BE(body.length, 1)
  body.copy(env, 5)
  const u = new URL(proxy.url)
  proxy.label = `plain Connect ${procedure}`
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: u.hostname, port: u.port, method: 'POST', path: `/${procedure}`, agent: false, timeout: 60_000,
      headers: {
        'Content-Type': 'application/connect+json',
        'Connect-Protocol-Version': '1',
        'E2b-Sandbox-Id': sbx.sandboxId,
        'E2b-Sandbox-Port': '49983',
        'X-Access-Token': sbx.envdAccessToken,
        ...headers,
      },
    }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => {
        const buf = Buffer.concat(chunks)
        if (res.statusCode !== 200) return resolve({ status: res.statusCode, frames: [], text: buf.toString() })
        const frames = []
        for (let i = 0; i + 5 <= buf.length;) {
          const n = buf.readUInt32BE(i + 1)
          frames.push({ flags: buf[i], json: JSON.parse(buf.subarray(i + 5, i + 5 + n).toString()) })
          i += 5 + n
        }
        resolve({ status: res.statusCode, frames })
      })
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error('no answer within 60 s')))
    req.on('error', reject)
    req.end(env)
  })
}

async function api (method, path, body) {
  const res = await fetch(DAEMON_URL + path, {
    method,
    headers: { 'X-API-Key': ADMIN_KEY, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

describe('e2b@2.51.0 fidelity', () => {
  const janitor = sandboxJanitor(Sandbox)
  let sbx
  const shared = () => { assert.ok(sbx, 'no shared sandbox: the first step failed'); return sbx }

  step('Sandbox.create reports envd 0.6.4', async ({ sdk }) => {
    sbx = janitor.track(await sdk('Sandbox.create()', () => Sandbox.create({ metadata: { suite: 'cella-e2b-compat', run: RUN }, timeoutMs: 300_000 })))
    const info = await sdk('sbx.getInfo()', () => sbx.getInfo())
    assert.equal(info.envdVersion, '0.6.4')
  })

  // ------------------------------------------------------------ timeouts
  step('a command timeout ends the stream with deadline_exceeded naming the limit, and kills the process', async ({ sdk }) => {
    const s = shared()
    const { frames } = await connectStream(s, 'process.Process/Start',
      { process: { cmd: '/bin/bash', args: ['-c', 'echo started; exec sleep 600'] }, stdin: false },
      { 'Connect-Timeout-Ms': '1500' })
    assert.ok(frames.length >= 2, `frames: ${JSON.stringify(frames)}`)
    const last = frames.at(-1)
    assert.equal(last.flags & 2, 2, `the stream did not end with an end-stream frame: ${JSON.stringify(frames)}`)
    assert.equal(last.json.error?.code, 'deadline_exceeded', `end of stream: ${JSON.stringify(last.json)}`)
    assert.match(last.json.error.message, /command timeout 1\.5s reached/)
    assert.ok(!frames.some((f) => f.json.event?.end), `an end event was sent: ${JSON.stringify(frames)}`)
    const pid = frames.find((f) => f.json.event?.start)?.json.event.start.pid
    assert.ok(pid > 0, 'no start event')
    await waitFor(`pid ${pid} to be killed`, async () => !(await sdk('sbx.commands.list()', () => s.commands.list())).some((p) => p.pid === pid), { timeout: 30_000 })
    // The SDK's own call raises TimeoutError.
    const err = await rejects(sdk("sbx.commands.run('sleep 600', {timeoutMs: 1500})", () => s.commands.run('sleep 600', { timeoutMs: 1500 })))
    assert.ok(err instanceof TimeoutError, `expected TimeoutError, got ${err?.name}: ${err?.message}`)
  })

  step('commands.kill of a process that already ended → false (not_found)', async ({ sdk }) => {
    const s = shared()
    const h = await sdk("sbx.commands.run('exit 0', {background:true})", () => s.commands.run('exit 0', { background: true }))
    await sdk('handle.wait()', () => h.wait())
    assert.equal(await sdk(`sbx.commands.kill(${h.pid})`, () => s.commands.kill(h.pid)), false)
  })

  // ------------------------------------------------------------ symlinks
  step("files.list('/') on a Debian root: /bin is a directory with symlinkTarget /usr/bin", async ({ sdk }) => {
    const s = shared()
    const entries = await sdk("sbx.files.list('/')", () => s.files.list('/'))
    const bin = entries.find((e) => e.name === 'bin')
    assert.ok(bin, `no /bin in ${JSON.stringify(entries.map((e) => e.name))}`)
    assert.equal(bin.type, 'dir')
    assert.equal(bin.symlinkTarget, '/usr/bin')
    assert.ok(entries.every((e) => e.type === 'file' || e.type === 'dir'), JSON.stringify(entries.map((e) => [e.name, e.type])))
    await sdk("sbx.commands.run('ln -s /etc/hostname ~/hn; ln -s /nowhere ~/dangling')",
      () => s.commands.run('ln -sf /etc/hostname ~/hn; ln -sf /nowhere ~/dangling'))
    const hn = await sdk("sbx.files.getInfo('/home/user/hn')", () => s.files.getInfo('/home/user/hn'))
    assert.equal(hn.type, 'file')
    assert.equal(hn.symlinkTarget, '/etc/hostname')
    const home = await sdk("sbx.files.list('/home/user')", () => s.files.list('/home/user'))
    assert.ok(home.some((e) => e.name === 'hn') && !home.some((e) => e.name === 'dangling'),
      `a dangling link is left out as envd's type-less entry: ${JSON.stringify(home.map((e) => e.name))}`)
  })

  // ------------------------------------------------------------ metadata (0.6.2)
  step('files.write({metadata}) → returned by write, getInfo and list; cleared on overwrite; kept on rename', async ({ sdk }) => {
    const s = shared()
    const p = '/home/user/meta/a.txt'
    const w = await sdk(`sbx.files.write('${p}', 'v1', {metadata})`, () => s.files.write(p, 'v1', { metadata: { owner: 'alice', purpose: 'test run' } }))
    assert.deepEqual(w.metadata, { owner: 'alice', purpose: 'test run' })
    assert.deepEqual((await sdk(`sbx.files.getInfo('${p}')`, () => s.files.getInfo(p))).metadata, { owner: 'alice', purpose: 'test run' })
    const listed = (await sdk("sbx.files.list('/home/user/meta')", () => s.files.list('/home/user/meta'))).find((e) => e.name === 'a.txt')
    assert.deepEqual(listed?.metadata, { owner: 'alice', purpose: 'test run' })
    // Stored as user.e2b.* xattrs on the sandbox's own filesystem (gVisor too).
    const xa = await sdk("sbx.commands.run('getfattr')", () => s.commands.run(`python3 -c "import os; print(sorted(os.listxattr('${p}')))"`))
    assert.match(xa.stdout, /user\.e2b\.owner/)
    // Octet-stream uploads carry it too.
    const o = await sdk('sbx.files.write(octet-stream, {metadata})', () => s.files.write(p, 'v2', { metadata: { owner: 'bob' }, useOctetStream: true }))
    assert.deepEqual(o.metadata, { owner: 'bob' })
    assert.deepEqual((await s.files.getInfo(p)).metadata, { owner: 'bob' })
    const plain = await sdk(`sbx.files.write('${p}', 'v3')`, () => s.files.write(p, 'v3'))
    assert.equal(plain.metadata, undefined)
    assert.equal((await s.files.getInfo(p)).metadata, undefined)
    await s.files.write(p, 'v4', { metadata: { owner: 'carol' } })
    const moved = await sdk(`sbx.files.rename('${p}', '/home/user/meta/b.txt')`, () => s.files.rename(p, '/home/user/meta/b.txt'))
    assert.deepEqual(moved.metadata, { owner: 'carol' })
    assert.deepEqual((await s.files.getInfo('/home/user/meta/b.txt')).metadata, { owner: 'carol' })
  })

  // ------------------------------------------------------------ signed URLs
  step('uploadUrl/downloadUrl made with E2B_SANDBOX_URL reach the sandbox with nothing but the URL', async ({ sdk }) => {
    const s = shared()
    const path = '/home/user/selfrouted/u.txt'
    const up = await sdk(`sbx.uploadUrl('${path}', {useSignatureExpiration: 120})`, () => s.uploadUrl(path, { useSignatureExpiration: 120 }))
    assert.ok(!up.includes(s.sandboxId), `the SDK's URL names no sandbox: ${up}`)
    const form = new FormData()
    form.append('file', new Blob(['self-routed upload']), path)
    // Plain fetch: no E2b-Sandbox-* headers, no access token.
    const put = await fetch(up, { method: 'POST', body: form })
    assert.equal(put.status, 200, await put.text())
    const down = await sdk(`sbx.downloadUrl('${path}')`, () => s.downloadUrl(path))
    const got = await fetch(down)
    assert.equal(got.status, 200)
    assert.equal(await got.text(), 'self-routed upload')
    // A tampered URL is not routed anywhere (and never reaches a sandbox).
    const bad = new URL(down)
    bad.searchParams.set('path', '/etc/shadow')
    assert.equal((await fetch(bad)).status, 404)
  })

  // ------------------------------------------------------------ secure: false
  step('secure: false → no envdAccessToken, envd answers without one; inside the sandbox the agent still needs it', async ({ sdk, exchanges }) => {
    const S = e2b250.Sandbox
    const open = janitor.track(await sdk('Sandbox.create({secure: false}) (e2b@2.50.0)',
      () => S.create({ secure: false, metadata: { suite: 'cella-e2b-compat', run: RUN }, timeoutMs: 120_000 })))
    const created = exchanges().filter((x) => x.method === 'POST' && /^\/sandboxes$/.test(x.url)).at(-1)
    assert.ok(created, 'no POST /sandboxes')
    assert.match(created.reqBody.toString(), /"secure":false/)
    assert.match(created.resBody.toString(), /"envdAccessToken":null/)
    assert.ok(!open.envdAccessToken, `the SDK holds a token: ${open.envdAccessToken}`)
    const r = await sdk("open.commands.run('id -un')", () => open.commands.run('id -un'))
    assert.equal(r.stdout.trim(), 'user')
    const noToken = exchanges().filter((x) => x.reqHeaders['e2b-sandbox-id'] === open.sandboxId)
    assert.ok(noToken.length > 0 && noToken.every((x) => !x.reqHeaders['x-access-token']), 'the SDK sent X-Access-Token')
    await sdk("open.files.write('/home/user/open.txt')", () => open.files.write('/home/user/open.txt', 'open'))
    assert.equal(await sdk("open.files.read('/home/user/open.txt')", () => open.files.read('/home/user/open.txt')), 'open')
    // A program inside the sandbox gets no root shell out of the agent.
    const inside = await sdk('open.commands.run(<curl the agent as uid 1000>)', () => open.commands.run(
      `curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -H 'Authorization: Basic cm9vdDo=' -d '{}' http://127.0.0.1:49983/process.Process/List`))
    assert.equal(inside.stdout.trim(), '401')
    // secure (the default) still enforces: without the token → 401.
    const s = shared()
    const { status } = await connectStream(s, 'process.Process/Start', { process: { cmd: '/bin/true' } }, { 'X-Access-Token': '' })
    assert.equal(status, 401)
  })

  // ------------------------------------------------------------ maskRequestHost
  step('network.maskRequestHost: the sandbox\'s server sees the masked Host (${PORT} filled in), the original in X-Forwarded-Host', async ({ sdk }) => {
    const m = janitor.track(await sdk("Sandbox.create({network: {maskRequestHost: '${PORT}-app.internal'}})",
      () => Sandbox.create({ network: { maskRequestHost: '${PORT}-app.internal' }, metadata: { suite: 'cella-e2b-compat', run: RUN }, timeoutMs: 120_000 })))
    const info = await sdk('m.getInfo()', () => m.getInfo())
    assert.equal(info.network?.maskRequestHost, '${PORT}-app.internal')
    const code = 'import http.server\nclass H(http.server.BaseHTTPRequestHandler):\n  def do_GET(self):\n    b = ("host=%s xfh=%s" % (self.headers.get("Host"), self.headers.get("X-Forwarded-Host"))).encode()\n    self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)\nhttp.server.HTTPServer(("0.0.0.0", 8003), H).serve_forever()\n'
    await m.files.write('/home/user/echo.py', code)
    const srv = await sdk("m.commands.run('python3 echo.py', {background:true})", () => m.commands.run('python3 /home/user/echo.py', { background: true, timeoutMs: 0 }))
    try {
      const r = await waitFor('the echo server on 8003', async () => {
        const x = await httpRequest({ path: '/', headers: { 'E2b-Sandbox-Id': m.sandboxId, 'E2b-Sandbox-Port': '8003' } })
        return x.status === 200 && x
      }, { timeout: 15_000, interval: 250 })
      assert.match(r.body, /^host=8003-app\.internal xfh=127\.0\.0\.1:\d+$/)
      // The agent's own port keeps the request's Host.
      const envs = await sdk("m.commands.run('echo ok')", () => m.commands.run('echo ok'))
      assert.equal(envs.stdout.trim(), 'ok')
    } finally {
      await srv.kill().catch(() => {})
    }
    const bad = await api('POST', '/v2/sandboxes', { templateID: 'base', timeout: 30, network: { maskRequestHost: 'bad host/with space' } })
    assert.equal(bad.status, 400)
    assert.match(bad.body.message, /maskRequestHost/)
  }, { timeout: 60_000 })

  // ------------------------------------------------------------ watch (0.6.3, 0.6.4)
  step('files.watchDir({includeEntry:true}) → events carry the entry', async ({ sdk }) => {
    const s = shared()
    await s.files.makeDir('/home/user/wentry')
    const events = []
    const w = await sdk("sbx.files.watchDir('/home/user/wentry', onEvent, {includeEntry:true})",
      () => s.files.watchDir('/home/user/wentry', (e) => events.push(e), { includeEntry: true }))
    try {
      await sdk("sbx.files.write('/home/user/wentry/x.txt', 'hello', {metadata})", () => s.files.write('/home/user/wentry/x.txt', 'hello', { metadata: { k: 'v' } }))
      const ev = await waitFor('an event for x.txt with its entry', () => events.find((e) => e.name === 'x.txt' && e.entry?.size === 5), { timeout: 10_000 })
      assert.equal(ev.entry.type, 'file')
      assert.equal(ev.entry.path, '/home/user/wentry/x.txt')
      await s.files.remove('/home/user/wentry/x.txt')
      const rm = await waitFor('a remove event', () => events.find((e) => e.type === FilesystemEventType.REMOVE), { timeout: 10_000 })
      assert.equal(rm.entry, undefined, 'a remove event carries no entry (envd)')
    } catch (e) {
      e.message += `\nevents received: ${JSON.stringify(events)}`
      throw e
    } finally {
      await w.stop()
    }
  })

  step('files.watchDir on a volume mount ({allowNetworkMounts:true}, and without); metadata on a volume', async ({ sdk }) => {
    const name = `w${RUN}`.slice(0, 30)
    const made = await api('POST', '/volumes', { name })
    assert.equal(made.status, 201, JSON.stringify(made.body))
    try {
      const v = janitor.track(await sdk("Sandbox.create({volumeMounts: {'/mnt/data': name}})",
        () => Sandbox.create({ volumeMounts: { '/mnt/data': name }, metadata: { suite: 'cella-e2b-compat', run: RUN }, timeoutMs: 120_000 })))
      try {
        // File metadata is kept on a volume too.
        const w = await sdk("v.files.write('/mnt/data/meta.txt', {metadata})", () => v.files.write('/mnt/data/meta.txt', 'm', { metadata: { on: 'volume' } }))
        assert.deepEqual(w.metadata, { on: 'volume' })
        assert.deepEqual((await v.files.getInfo('/mnt/data/meta.txt')).metadata, { on: 'volume' })
        for (const opts of [{ allowNetworkMounts: true, includeEntry: true }, {}]) {
          const events = []
          const w = await sdk(`v.files.watchDir('/mnt/data', onEvent, ${JSON.stringify(opts)})`, () => v.files.watchDir('/mnt/data', (e) => events.push(e), opts))
          try {
            const f = `f${Object.keys(opts).length}.txt`
            await sdk(`v.files.write('/mnt/data/${f}')`, () => v.files.write(`/mnt/data/${f}`, 'on the volume'))
            await waitFor(`an event for ${f}`, () => events.some((e) => e.name === f), { timeout: 10_000 })
          } finally {
            await w.stop()
          }
        }
      } finally {
        await Sandbox.kill(v.sandboxId)
      }
    } finally {
      await api('DELETE', `/volumes/${name}`)
    }
  })
})

after(() => closeProxy())
