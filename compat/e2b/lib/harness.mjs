// Shared plumbing for the E2B conformance tests: the daemon coordinates (from
// run.sh), the logging proxy the SDK talks through, the `step` test wrapper
// that prints the SDK call and cella's exchanges on failure, and helpers.
import { it, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { inspect } from 'node:util'
import { startProxy, formatExchanges } from './proxy.mjs'

export const DAEMON_URL = process.env.CELLA_E2B_URL
export const ADMIN_KEY = process.env.CELLA_E2B_KEY
if (!DAEMON_URL || !ADMIN_KEY) {
  throw new Error('CELLA_E2B_URL / CELLA_E2B_KEY are not set: run the suite with compat/e2b/run.sh, which starts its own daemon')
}
for (const u of [DAEMON_URL]) {
  const h = new URL(u).hostname
  if (h !== '127.0.0.1' && h !== 'localhost') throw new Error(`refusing to test a non-loopback daemon: ${u}`)
}

// The proxy is started at import time (top-level await) so that the SDK
// environment is in place before any describe block runs.
export const proxy = await startProxy(DAEMON_URL)
process.env.E2B_API_URL = proxy.url
// Diagnostic only: CELLA_E2B_SANDBOX_DIRECT=1 sends sandbox traffic straight
// to the daemon (to rule the proxy out); assertions on recorded sandbox
// exchanges then fail.
process.env.E2B_SANDBOX_URL = process.env.CELLA_E2B_SANDBOX_DIRECT === '1' ? DAEMON_URL : proxy.url
process.env.E2B_API_KEY = ADMIN_KEY
// The Volume class reaches the standalone file API (/volumecontent) here
// (without it: https://api.<domain>); cella serves it on the API listener.
process.env.E2B_VOLUME_API_URL = proxy.url
delete process.env.E2B_DEBUG
delete process.env.E2B_DOMAIN
delete process.env.E2B_ACCESS_TOKEN
// Test files call closeProxy() from a root-level after(), registered after all
// their describe blocks (a root after() registered earlier, or describe blocks
// registered after a top-level await, would let it run too soon).
export const closeProxy = () => proxy.close()

const MAX_DUMP = 60

function decorate (err, ctx, exchanges) {
  const lines = []
  if (ctx.failedCall) lines.push(`SDK call that failed: ${ctx.failedCall}`)
  else if (ctx.calls.length) lines.push(`last SDK call before the failure: ${ctx.calls.at(-1)}`)
  else lines.push('no SDK call was made')
  lines.push(`requests cella received during this test (${exchanges.length}${exchanges.length > MAX_DUMP ? `, last ${MAX_DUMP} shown` : ''}):`)
  lines.push(formatExchanges(exchanges.slice(-MAX_DUMP)))
  const dump = lines.join('\n')
  const original = err instanceof Error ? err.message : inspect(err)
  const wrapped = new Error(`${original}\n${dump}`, { cause: err })
  wrapped.name = err?.name || 'Error'
  // Assertion details (actual/expected) stay visible through `cause`.
  return wrapped
}

// A test case bounded in time. fn receives { sdk, t, exchanges } where
// sdk(label, () => promise) runs one SDK call under a label that tags the
// exchanges it causes and names it if it throws, and exchanges() returns the
// proxy records of this test so far.
export function step (name, fn, { timeout = 45_000 } = {}) {
  it(name, { timeout: timeout + 10_000 }, async (t) => {
    const mark = proxy.mark()
    const ctx = { calls: [], failedCall: null }
    const sdk = async (label, f) => {
      ctx.calls.push(label)
      proxy.label = label
      try {
        return await f()
      } catch (e) {
        ctx.failedCall ??= label
        e.sdkCall ??= label
        throw e
      }
    }
    let timer
    try {
      await Promise.race([
        fn({ sdk, t, exchanges: () => proxy.since(mark) }),
        new Promise((resolve, reject) => {
          timer = setTimeout(() => reject(new Error(`test timed out after ${timeout} ms`)), timeout)
        }),
      ])
    } catch (e) {
      throw decorate(e, ctx, proxy.since(mark))
    } finally {
      clearTimeout(timer)
      proxy.label = ''
    }
  })
}

// Expect a promise to reject; returns the error (so callers can assert on it).
export async function rejects (promise, what = 'the call') {
  try {
    const v = await promise
    throw Object.assign(new Error(`expected ${what} to throw, it returned ${inspect(v, { depth: 2 })}`), { noThrow: true })
  } catch (e) {
    if (e.noThrow) throw e
    return e
  }
}

// The exchanges of the current test matching method and path (a RegExp on the
// request URL, path + query).
export function matching (exchanges, method, re) {
  return exchanges.filter((x) => x.method === method && re.test(x.url))
}
// The last of them; fails the test if the SDK sent none.
export function one (exchanges, method, re) {
  const found = matching(exchanges, method, re)
  assert.ok(found.length > 0, `expected the SDK to send ${method} ${re} (it did not)`)
  return found.at(-1)
}
// The JSON request (side 'req') or response (side 'res') body of an exchange.
export function jsonBody (ex, side = 'res') {
  const excerpt = side === 'req' ? ex.reqBody : ex.resBody
  const headers = side === 'req' ? ex.reqHeaders : ex.resHeaders
  const s = excerpt.text(headers['content-encoding'])
  assert.ok(s !== null, `body too long or not decodable for a JSON check: ${excerpt.toString(headers['content-encoding'])}`)
  try { return JSON.parse(s) } catch { assert.fail(`expected a JSON body, got: ${s}`) }
}
// date is a valid Date within slackMs of expectedMs.
export function near (date, expectedMs, slackMs, what) {
  assert.ok(date instanceof Date && !isNaN(date), `${what} is not a valid Date: ${date}`)
  assert.ok(Math.abs(date.getTime() - expectedMs) <= slackMs,
    `${what} = ${date.toISOString()}, expected within ${slackMs} ms of ${new Date(expectedMs).toISOString()}`)
}
// date lies in [loMs, hiMs]: for a server time set while a call was under
// way, bounded by the client's clock before and after the call (same host),
// so a slow call on a loaded machine cannot push it out of a fixed window.
export function between (date, loMs, hiMs, what) {
  assert.ok(date instanceof Date && !isNaN(date), `${what} is not a valid Date: ${date}`)
  assert.ok(date.getTime() >= loMs && date.getTime() <= hiMs,
    `${what} = ${date.toISOString()}, expected between ${new Date(loMs).toISOString()} and ${new Date(hiMs).toISOString()}`)
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

export async function waitFor (what, f, { timeout = 10_000, interval = 100 } = {}) {
  const deadline = Date.now() + timeout
  let last
  for (;;) {
    try {
      const v = await f()
      if (v) return v
    } catch (e) { last = e }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}${last ? `; last error: ${last.message}` : ''}`)
    await sleep(interval)
  }
}

// A plain HTTP request through the proxy, with explicit headers (Host too):
// resolves to { status, headers, body }.
export function httpRequest ({ method = 'GET', path = '/', headers = {}, body, timeout = 10_000 }) {
  const u = new URL(proxy.url)
  proxy.label = `plain HTTP ${method} ${path}${headers.Host ? ` Host ${headers.Host}` : ''}`
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, method, path, headers, agent: false, timeout }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeout} ms`)))
    req.on('error', reject)
    req.end(body)
  })
}

// Every sandbox a describe block creates is registered here and killed in its
// `after`, whatever happened.
export function sandboxJanitor (Sandbox) {
  const ids = new Set()
  after(async () => {
    await Promise.all([...ids].map((id) => Sandbox.kill(id).catch(() => {})))
  })
  return { track (sbx) { ids.add(sbx.sandboxId); return sbx }, ids }
}

export { before, after }

// A key of a team of its own (the admin makes it): another tenant.
export async function teamKey (name, team) {
  const res = await fetch(`${DAEMON_URL}/keys`, {
    method: 'POST',
    headers: { 'X-API-Key': ADMIN_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name, team }),
  })
  if (res.status !== 201) throw new Error(`POST /keys: ${res.status} ${await res.text()}`)
  return (await res.json()).key
}
