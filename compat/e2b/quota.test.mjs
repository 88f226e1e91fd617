// E2B SDK conformance for per-key quotas: the real, unmodified e2b@2.51.0
// SDK against a key's limits. Past a limit cella answers 429 in E2B's error
// shape, naming the limit; the SDK surfaces it as RateLimitError.
//
// The SDK retries a 429 (up to 3 times) only when it carries an integer
// Retry-After that fits in the request's timeout (60 s by default; SDK
// src/retry.ts): a concurrency limit has no Retry-After, and the rates here
// (1/h, 2/h) give one of about an hour, so each refusal below is exactly one
// exchange — counted from the proxy's records, not timed.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { step, rejects, closeProxy, matching, DAEMON_URL, ADMIN_KEY, jsonBody, sandboxJanitor } from './lib/harness.mjs'

const e2b = await import('e2b-2.51.0')
const { Sandbox, RateLimitError } = e2b
const SDK_REQUEST_TIMEOUT_MS = 60_000

const RUN = `r${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`

// A key of its own made with the admin key (keys are admin-only).
async function newKey (name, limits) {
  const res = await fetch(`${DAEMON_URL}/keys`, {
    method: 'POST',
    headers: { 'X-API-Key': ADMIN_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: `${name}-${RUN}`, ...limits }),
  })
  const text = await res.text()
  assert.equal(res.status, 201, `POST /keys: ${res.status} ${text}`)
  return JSON.parse(text)
}

// The one refused exchange of a call: 429, E2B's {code, message}.
function refused (exchanges, method, re) {
  const found = matching(exchanges, method, re).filter((x) => x.status === 429)
  assert.equal(found.length, 1, `expected exactly one 429 for ${method} ${re} (the SDK does not retry these), got ${found.length}`)
  const body = jsonBody(found[0])
  assert.deepEqual(Object.keys(body).sort(), ['code', 'message'])
  assert.equal(body.code, 429)
  return found[0]
}

const CREATE = /^\/(v2\/)?sandboxes$/

describe('e2b@2.51.0 quotas', () => {
  const janitor = sandboxJanitor(Sandbox)

  step('maxSandboxes 1: the second Sandbox.create → RateLimitError naming the limit; no Retry-After, no retry; a kill frees the slot', async ({ sdk, exchanges }) => {
    const k = await newKey('max1', { maxSandboxes: 1 })
    const first = janitor.track(await sdk('Sandbox.create (1st)', () => Sandbox.create({ apiKey: k.key, timeoutMs: 120_000 })))
    const err = await rejects(sdk('Sandbox.create (2nd)', () => Sandbox.create({ apiKey: k.key, timeoutMs: 120_000 })), 'a create past maxSandboxes')
    assert.ok(err instanceof RateLimitError, `expected a RateLimitError, got ${err?.name}: ${err?.message}`)
    assert.match(err.message, /limit of 1 running sandboxes \(maxSandboxes/)
    assert.match(err.message, new RegExp(`cella key update ${k.name} --max-sandboxes N`))
    const ex = refused(exchanges(), 'POST', CREATE)
    assert.equal(ex.resHeaders['retry-after'], undefined, 'a concurrency limit has no Retry-After')
    await sdk('Sandbox.kill (1st)', () => Sandbox.kill(first.sandboxId, { apiKey: k.key }))
    janitor.track(await sdk('Sandbox.create (after the kill)', () => Sandbox.create({ apiKey: k.key, timeoutMs: 120_000 })))
  })

  step('createRate 1/h: the second Sandbox.create → RateLimitError with Retry-After beyond the SDK timeout (not retried)', async ({ sdk, exchanges }) => {
    const k = await newKey('rate', { createRate: '1/h' })
    janitor.track(await sdk('Sandbox.create (1st)', () => Sandbox.create({ apiKey: k.key, timeoutMs: 120_000 })))
    const err = await rejects(sdk('Sandbox.create (2nd)', () => Sandbox.create({ apiKey: k.key, timeoutMs: 120_000 })), 'a create past createRate')
    assert.ok(err instanceof RateLimitError, `expected a RateLimitError, got ${err?.name}: ${err?.message}`)
    assert.match(err.message, /create rate of 1\/h \(createRate\)/)
    assert.match(err.message, new RegExp(`cella key update ${k.name} --create-rate N/h`))
    const ex = refused(exchanges(), 'POST', CREATE)
    const retryAfter = Number(ex.resHeaders['retry-after'])
    assert.ok(Number.isInteger(retryAfter) && retryAfter * 1000 >= SDK_REQUEST_TIMEOUT_MS,
      `Retry-After ${ex.resHeaders['retry-after']}: an integer past the SDK's ${SDK_REQUEST_TIMEOUT_MS} ms`)
  })

  step('requestRate 2/h: the third call of any kind → RateLimitError', async ({ sdk, exchanges }) => {
    const k = await newKey('req', { requestRate: '2/h' })
    for (const i of [1, 2]) await sdk(`Sandbox.list (${i})`, () => Sandbox.list({ apiKey: k.key }).nextItems())
    const err = await rejects(sdk('Sandbox.list (3rd)', () => Sandbox.list({ apiKey: k.key }).nextItems()), 'a request past requestRate')
    assert.ok(err instanceof RateLimitError, `expected a RateLimitError, got ${err?.name}: ${err?.message}`)
    assert.match(err.message, /request rate of 2\/h \(requestRate\)/)
    refused(exchanges(), 'GET', /^\/(v2\/)?sandboxes(\?.*)?$/)
  })
})

after(closeProxy)
