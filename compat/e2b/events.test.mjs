// E2B lifecycle events and webhooks: GET /events/sandboxes/{id} and the
// /events/webhooks CRUD (REST, as E2B documents them: the SDKs have no
// class for them), driven by real e2b@2.51.0 lifecycle calls (create,
// setTimeout, pause, resume through connect, kill). Deliveries go to a
// receiver this process runs on loopback (run.sh starts the daemon with
// --webhook-allow 127.0.0.1) and are verified with E2B's documented
// e2b-signature check. Another team sees none of it, and a webhook URL
// cannot point the daemon at the metadata service or a private network.
import { describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import crypto from 'node:crypto'
import { step, rejects, waitFor, sandboxJanitor, teamKey, closeProxy, DAEMON_URL, ADMIN_KEY } from './lib/harness.mjs'

const e2b = await import('e2b-2.51.0')
const { Sandbox } = e2b

const RUN = `r${Date.now().toString(36)}`
const SECRET = `whsec-${crypto.randomBytes(12).toString('hex')}`
const TYPES = ['sandbox.lifecycle.created', 'sandbox.lifecycle.updated', 'sandbox.lifecycle.paused', 'sandbox.lifecycle.resumed', 'sandbox.lifecycle.killed']

// E2B's documented verification, verbatim in spirit: sha256(secret + raw
// body), base64, '=' stripped.
function verify (secret, raw, signature) {
  const expected = crypto.createHash('sha256').update(secret + raw).digest('base64').replace(/=+$/, '')
  return expected === signature
}

// The receiver: every delivery, and a switch to fail the next ones.
const got = [] // { path, headers, raw, json }
let failNext = 0
const receiver = http.createServer((req, res) => {
  const chunks = []
  req.on('data', (c) => chunks.push(c))
  req.on('end', () => {
    const raw = Buffer.concat(chunks).toString('utf8')
    got.push({ path: req.url, headers: req.headers, raw, json: JSON.parse(raw) })
    if (failNext > 0) { failNext--; res.writeHead(503); res.end('try later'); return }
    res.writeHead(200); res.end('ok')
  })
})
let hookURL
before(async () => {
  await new Promise((resolve) => receiver.listen(0, '127.0.0.1', resolve))
  hookURL = `http://127.0.0.1:${receiver.address().port}`
})
after(() => { receiver.closeAllConnections(); receiver.close() })

async function api (method, path, { key = ADMIN_KEY, body } = {}) {
  const res = await fetch(`${DAEMON_URL}${path}`, {
    method,
    headers: { 'X-API-Key': key, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : undefined }
}

describe('E2B lifecycle events and webhooks', () => {
  const janitor = sandboxJanitor(Sandbox)
  let hook
  let sbxId

  after(async () => {
    if (hook) await api('DELETE', `/events/webhooks/${hook.id}`).catch(() => {})
  })

  step('POST /events/webhooks → 201 {id, teamID, name, createdAt, enabled, url, events}, never the secret', async () => {
    const r = await api('POST', '/events/webhooks', { body: { name: `hook ${RUN}`, url: `${hookURL}/all`, enabled: true, events: TYPES, signatureSecret: SECRET } })
    assert.equal(r.status, 201, JSON.stringify(r.body))
    hook = r.body
    assert.deepEqual(Object.keys(hook).sort(), ['createdAt', 'enabled', 'events', 'id', 'name', 'teamID', 'url'])
    assert.match(hook.id, /^wh_[0-9a-f]{20}$/)
    assert.equal(hook.url, `${hookURL}/all`)
    assert.equal(hook.enabled, true)
    assert.deepEqual(hook.events, [...TYPES].sort())
    const list = await api('GET', '/events/webhooks')
    assert.ok(list.body.some((w) => w.id === hook.id))
    assert.doesNotMatch(JSON.stringify(list.body), new RegExp(SECRET))
    const one = await api('GET', `/events/webhooks/${hook.id}`)
    assert.deepEqual(one.body, hook)
  })

  step('create, setTimeout, pause, resume (connect), kill → the receiver gets each event, signed; GET /events/sandboxes/{id} lists them', async ({ sdk }) => {
    const sbx = janitor.track(await sdk('Sandbox.create({metadata})', () => Sandbox.create({ metadata: { run: RUN }, timeoutMs: 120_000 })))
    sbxId = sbx.sandboxId
    await sdk('sbx.setTimeout', () => sbx.setTimeout(150_000))
    await sdk('sbx.pause', () => sbx.pause())
    await sdk('Sandbox.connect (resume)', () => Sandbox.connect(sbxId))
    await sdk('sbx.kill', () => sbx.kill())
    const mine = () => got.filter((g) => g.json.sandbox_id === sbxId)
    await waitFor('five deliveries for the sandbox', () => mine().length >= 5, { timeout: 30_000 })
    const evs = mine()
    assert.deepEqual(evs.map((g) => g.json.type), TYPES)
    for (const g of evs) {
      assert.ok(verify(SECRET, g.raw, g.headers['e2b-signature']), `signature of ${g.json.type} does not verify`)
      assert.equal(g.headers['e2b-signature-version'], 'v1')
      assert.equal(g.headers['e2b-webhook-id'], hook.id)
      assert.match(g.headers['e2b-delivery-id'], /^[0-9a-f-]{36}$/)
      assert.equal(g.headers['content-type'], 'application/json')
      assert.equal(g.path, '/all')
      assert.equal(g.json.version, 'v2')
      assert.equal(g.json.event_category, 'lifecycle')
      assert.equal(g.json.sandbox_template_id, 'base')
      assert.equal(g.json.sandbox_team_id, hook.teamID)
      assert.deepEqual(g.json.event_data.sandbox_metadata, { run: RUN })
      assert.ok(!isNaN(Date.parse(g.json.timestamp)))
    }
    assert.deepEqual(evs.map((g) => g.json.event_label), ['create', 'update', 'pause', 'resume', 'kill'])
    const killed = evs[4].json.event_data.execution
    assert.equal(killed.vcpu_count, 1)
    assert.equal(killed.memory_mb, 512)
    assert.ok(killed.execution_time > 0)
    // The polling API: the same events, newest first by default.
    const listed = await api('GET', `/events/sandboxes/${sbxId}`)
    assert.equal(listed.status, 200)
    assert.deepEqual(listed.body.map((e) => e.type), [...TYPES].reverse())
    assert.deepEqual(listed.body.map((e) => e.id).reverse(), evs.map((g) => g.json.id))
    const asc = await api('GET', `/events/sandboxes/${sbxId}?orderAsc=true&limit=2&offset=1`)
    assert.deepEqual(asc.body.map((e) => e.type), TYPES.slice(1, 3))
  }, { timeout: 120_000 })

  step('updateNetwork is an updated event, and a TTL expiry a killed one', async ({ sdk }) => {
    const sbx = janitor.track(await sdk('Sandbox.create({timeoutMs: 3000})', () => Sandbox.create({ timeoutMs: 3_000 })))
    await sdk('sbx.updateNetwork', () => sbx.updateNetwork({ allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] }))
    const mine = () => got.filter((g) => g.json.sandbox_id === sbx.sandboxId)
    await waitFor('created, updated and killed by the TTL', () => mine().length >= 3, { timeout: 60_000, interval: 200 })
    assert.deepEqual(mine().map((g) => [g.json.type, g.json.event_data?.cella_detail]),
      [['sandbox.lifecycle.created', undefined], ['sandbox.lifecycle.updated', 'network'], ['sandbox.lifecycle.killed', undefined]])
    assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'the TTL killed it')
  }, { timeout: 90_000 })

  step("another team sees no events of the sandbox and none of the webhooks; its own webhook gets none of ours", async () => {
    const bob = await teamKey(`bob-${RUN}`, `blue-${RUN}`)
    const r = await api('GET', `/events/sandboxes/${sbxId}`, { key: bob })
    assert.deepEqual([r.status, r.body], [200, []])
    assert.ok((await api('GET', '/events/sandboxes?limit=1000')).body.some((e) => e.sandbox_id === sbxId), "the team-wide list has the team's events")
    assert.deepEqual((await api('GET', '/events/sandboxes', { key: bob })).body, [], "another team's list is empty")
    for (const [m, body] of [['GET'], ['PATCH', { enabled: false }], ['DELETE']]) {
      const x = await api(m, `/events/webhooks/${hook.id}`, { key: bob, body })
      assert.equal(x.status, 404, `${m} of another team's webhook: ${JSON.stringify(x.body)}`)
    }
    assert.deepEqual((await api('GET', '/events/webhooks', { key: bob })).body, [])
    const bobHook = await api('POST', '/events/webhooks', { key: bob, body: { name: 'bob', url: `${hookURL}/bob`, events: TYPES, signatureSecret: 'bob-secret-123' } })
    assert.equal(bobHook.status, 201)
    const sbx = janitor.track(await Sandbox.create({ timeoutMs: 60_000 }))
    await sbx.kill()
    await waitFor('our webhook got the new sandbox events', () => got.filter((g) => g.json.sandbox_id === sbx.sandboxId).length >= 2, { timeout: 30_000 })
    assert.equal(got.filter((g) => g.path === '/bob').length, 0, "bob's webhook got another team's events")
    assert.equal((await api('GET', `/events/webhooks/${hook.id}`)).body.enabled, true, 'unchanged')
    await api('DELETE', `/events/webhooks/${bobHook.body.id}`, { key: bob })
  }, { timeout: 90_000 })

  step('a URL outside --webhook-allow (metadata service, private network, another loopback address, a name) → 403; a bad body → 400', async () => {
    for (const url of ['http://169.254.169.254/latest/meta-data/', 'http://10.0.0.1/hook', 'http://127.0.0.2:8080/', 'http://[::1]/', 'https://example.com/hook']) {
      const r = await api('POST', '/events/webhooks', { body: { name: 'x', url, events: TYPES, signatureSecret: 'secret-secret' } })
      assert.equal(r.status, 403, `${url}: ${JSON.stringify(r.body)}`)
      assert.match(r.body.message, /--webhook-allow/)
      const u = await api('PATCH', `/events/webhooks/${hook.id}`, { body: { url } })
      assert.equal(u.status, 403, `PATCH to ${url}`)
    }
    for (const body of [
      { name: 'x', url: `${hookURL}/`, events: ['sandbox.lifecycle.exploded'], signatureSecret: 'secret-secret' },
      { name: 'x', url: `${hookURL}/`, events: [], signatureSecret: 'secret-secret' },
      { name: 'x', url: `${hookURL}/`, events: TYPES },
      { name: 'x', url: 'file:///etc/passwd', events: TYPES, signatureSecret: 'secret-secret' },
    ]) {
      const r = await api('POST', '/events/webhooks', { body })
      assert.equal(r.status, 400, JSON.stringify(body))
    }
    assert.equal((await api('GET', `/events/webhooks/${hook.id}`)).body.url, `${hookURL}/all`)
  })

  step('a failing receiver gets the delivery again (E2B: 3 retries, 10 s apart), with a new e2b-delivery-id', async () => {
    failNext = 1
    const sbx = janitor.track(await Sandbox.create({ timeoutMs: 60_000 }))
    const created = () => got.filter((g) => g.json.sandbox_id === sbx.sandboxId && g.json.type === 'sandbox.lifecycle.created')
    await waitFor('the retried created event', () => created().length >= 2, { timeout: 40_000, interval: 200 })
    const [first, second] = created()
    assert.equal(first.json.id, second.json.id, 'the same event')
    assert.equal(first.raw, second.raw)
    assert.notEqual(first.headers['e2b-delivery-id'], second.headers['e2b-delivery-id'])
    await sbx.kill()
    // The attempts are in the sandbox's audit log.
    const logs = await fetch(`${DAEMON_URL}/sandboxes/${sbx.sandboxId}/logs`, { headers: { 'X-API-Key': ADMIN_KEY } }).then((r) => r.json())
    const text = JSON.stringify(logs)
    assert.match(text, new RegExp(`webhook ${hook.id}.*sandbox.lifecycle.created.*503.*attempt 1 of 4`))
    assert.match(text, new RegExp(`webhook ${hook.id}.*sandbox.lifecycle.created.*200 OK.*attempt 2 of 4`))
  }, { timeout: 90_000 })

  step('PATCH enabled:false → no more deliveries; DELETE → 200, then 404', async () => {
    const p = await api('PATCH', `/events/webhooks/${hook.id}`, { body: { enabled: false } })
    assert.equal(p.status, 200)
    assert.equal(p.body.enabled, false)
    const before = got.length
    const sbx = janitor.track(await Sandbox.create({ timeoutMs: 60_000 }))
    await sbx.kill()
    await waitFor('the events stored', async () => (await api('GET', `/events/sandboxes/${sbx.sandboxId}`)).body.length === 2)
    assert.equal(got.length, before, 'a disabled webhook got deliveries')
    const d = await api('DELETE', `/events/webhooks/${hook.id}`)
    assert.deepEqual([d.status, d.body], [200, { id: hook.id }])
    assert.equal((await api('GET', `/events/webhooks/${hook.id}`)).status, 404)
    hook = undefined
  }, { timeout: 60_000 })
})

after(() => closeProxy())
