// E2B SDK conformance for egress policy: allowInternetAccess, network.allowOut
// / denyOut and updateNetwork, with the real e2b SDKs, against a daemon that
// run.sh starts with an egress ceiling of `*.test` and every .test name
// resolving to 127.0.0.1 (--egress-ceiling '*.test' --egress-resolve
// '*.test=127.0.0.1'). The upstream is an HTTP server this process starts on
// loopback; nothing leaves the machine.
import { describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { step, rejects, waitFor, sandboxJanitor, closeProxy } from './lib/harness.mjs'

const VERSIONS = ['2.45.0', '2.51.0']
const SDKS = await Promise.all(VERSIONS.map((v) => import(`e2b-${v}`)))

// One upstream for all: it answers with the name it was asked for.
let upstreamPort
const upstream = http.createServer((req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/plain' })
  res.end(`upstream saw ${req.headers.host}\n`)
})
before(async () => {
  await new Promise((resolve) => upstream.listen(0, '127.0.0.1', resolve))
  upstreamPort = upstream.address().port
})
after(() => { upstream.closeAllConnections(); upstream.close() })

// curl inside the sandbox: the body, or the failure with curl's reason.
async function fetchIn (sbx, host) {
  const r = await sbx.commands.run(`curl -sS -m 5 http://${host}:${upstreamPort}/ 2>&1; echo "rc=$?"`, { timeoutMs: 20_000 })
  return r.stdout
}

for (const [i, version] of VERSIONS.entries()) {
  const { Sandbox } = SDKS[i]
  describe(`e2b@${version} network`, () => {
    const janitor = sandboxJanitor(Sandbox)

    step('allowInternetAccess: false → nothing is reachable, getInfo says so', async ({ sdk }) => {
      const sbx = janitor.track(await sdk('Sandbox.create({allowInternetAccess:false})', () => Sandbox.create({ allowInternetAccess: false, timeoutMs: 120_000 })))
      const out = await fetchIn(sbx, 'allowed.test')
      assert.match(out, /rc=[1-9]/, `the request must fail: ${out}`)
      assert.doesNotMatch(out, /upstream saw/)
      const info = await sbx.getInfo()
      assert.equal(info.allowInternetAccess, false)
    }, { timeout: 90_000 })

    step('no network option → the operator ceiling (*.test) is reachable', async ({ sdk }) => {
      const sbx = janitor.track(await sdk('Sandbox.create()', () => Sandbox.create({ timeoutMs: 120_000 })))
      const out = await fetchIn(sbx, 'allowed.test')
      assert.match(out, /upstream saw allowed\.test/, out)
    }, { timeout: 90_000 })

    step('network.allowOut + denyOut [ALL_TRAFFIC] → only the listed name; updateNetwork swaps it within a second', async ({ sdk }) => {
      const sbx = janitor.track(await sdk("Sandbox.create({network:{allowOut:['allowed.test'],denyOut:['0.0.0.0/0']}})",
        () => Sandbox.create({ network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] }, timeoutMs: 120_000 })))
      assert.match(await fetchIn(sbx, 'allowed.test'), /upstream saw allowed\.test/)
      const blocked = await fetchIn(sbx, 'other.test')
      assert.match(blocked, /rc=[1-9]/, blocked)
      const info = await sbx.getInfo()
      if (info.network) { // the 2.45 SDK does not map network
        assert.deepEqual(info.network.allowOut, ['allowed.test'])
        assert.deepEqual(info.network.denyOut, ['0.0.0.0/0'])
      }
      if (typeof sbx.updateNetwork !== 'function') return // not in this SDK version
      await sdk("sbx.updateNetwork({allowOut:['other.test'],denyOut:['0.0.0.0/0']})",
        () => sbx.updateNetwork({ allowOut: ['other.test'], denyOut: ['0.0.0.0/0'] }))
      const updated = Date.now()
      // How soon the swap applies is judged by the attempts that still found
      // other.test blocked (each began after the call returned), not by the
      // total time, which on a loaded machine is mostly commands.run + curl.
      let lastBlocked = null
      await waitFor('other.test reachable after updateNetwork', async () => {
        const began = Date.now()
        const ok = /upstream saw other\.test/.test(await fetchIn(sbx, 'other.test'))
        if (!ok) lastBlocked = began
        return ok
      }, { timeout: 20_000, interval: 100 })
      assert.ok(lastBlocked === null || lastBlocked - updated < 5_000,
        `other.test was still unreachable in an attempt begun ${lastBlocked - updated} ms after updateNetwork returned`)
      assert.match(await fetchIn(sbx, 'allowed.test'), /rc=[1-9]/)
      await sbx.updateNetwork({ allowInternetAccess: false })
      assert.match(await fetchIn(sbx, 'other.test'), /rc=[1-9]/)
    }, { timeout: 90_000 })

    step('an allowOut entry outside the operator ceiling → 403 naming the ceiling', async ({ sdk }) => {
      const err = await rejects(Sandbox.create({ network: { allowOut: ['example.com'] }, timeoutMs: 60_000 }), 'create outside the ceiling')
      assert.match(String(err.message), /example\.com/)
      assert.match(String(err.message), /ceiling/)
      assert.match(String(err.message), /\*\.test/)
    })
  })
}

// Registered last so that it runs after every suite's own after(): the
// logging proxy must outlive the janitors' kills.
after(() => closeProxy())
