// E2B SDK conformance for secrets: the real, unmodified e2b@2.51.0 SDK (the
// first with the Secret class) against cella's /secrets API. Run with
// ./run.sh, which starts the daemon and sets E2B_API_KEY to its admin key
// (secrets are admin-only on cella).
//
// The tests run in order and share the secrets they create; the last one
// checks that no answer cella gave during the suite carried a value.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { step, rejects, proxy, DAEMON_URL, ADMIN_KEY, closeProxy, matching, one, jsonBody, near } from './lib/harness.mjs'

const e2b = await import('e2b-2.51.0')
const { Secret, SecretError, SecretNotFoundError } = e2b

// Names unique to this run, so a rerun against a kept data dir cannot clash.
const RUN = `r${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`
const NAME = `openai-api-key.${RUN}`
const ID_RE = /^sec_[0-9a-z]{20}$/
// Every value sent: none may come back in any answer.
const VALUES = [`sk-live-FIRST-${RUN}-0123456789`, `sk-live-SECOND-${RUN}-abcdef`, `sk-live-THIRD-${RUN}-zyx`]
const PAGE_NAMES = ['a', 'b', 'c'].map((s) => `page-${s}.${RUN}`)
const PAGE_VALUE = (n) => `page-VALUE-${n}`

describe('e2b@2.51.0 Secret', () => {
  const markAtStart = proxy.mark()
  let created // SecretInfo from Secret.create

  after(async () => {
    // Leave nothing behind, whatever failed.
    for (const n of [NAME, ...PAGE_NAMES]) await Secret.destroy(n).catch(() => {})
  })

  step('Secret.create(name, value, {metadata}) → 201 with secretId, name, version 1, metadata, dates', async ({ sdk, exchanges }) => {
    const t0 = Date.now()
    created = await sdk('Secret.create', () => Secret.create(NAME, VALUES[0], { metadata: { owner: 'ml', env: 'prod' } }))
    assert.match(created.secretId, ID_RE)
    assert.equal(created.name, NAME)
    assert.equal(created.version, 1)
    assert.deepEqual(created.metadata, { owner: 'ml', env: 'prod' })
    near(created.createdAt, t0, 10_000, 'createdAt')
    assert.equal(created.updatedAt.getTime(), created.createdAt.getTime())
    const ex = one(exchanges(), 'POST', /^\/secrets$/)
    assert.equal(ex.status, 201)
    const body = jsonBody(ex)
    assert.deepEqual(Object.keys(body).sort(), ['createdAt', 'currentVersion', 'metadata', 'name', 'secretID', 'updatedAt'])
  })

  step('Secret.create of a taken name → SecretError 409 naming the update path; the value is unchanged', async ({ sdk, exchanges }) => {
    const err = await rejects(sdk('Secret.create (again)', () => Secret.create(NAME, 'clobber-VALUE')), 'a duplicate Secret.create')
    assert.ok(err instanceof SecretError, `expected a SecretError, got ${err?.name}: ${err?.message}`)
    assert.match(err.message, /^409: secret ".*" already exists.*update/)
    const ex = one(exchanges(), 'POST', /^\/secrets$/)
    assert.equal(ex.status, 409)
    assert.deepEqual(Object.keys(jsonBody(ex)).sort(), ['code', 'message'])
    const info = await sdk('Secret.getInfo', () => Secret.getInfo(NAME))
    assert.equal(info.version, 1, 'a refused create must not add a version')
  })

  step('Secret.getInfo by name and by ID → the same info', async ({ sdk }) => {
    for (const ref of [NAME, created.secretId]) {
      const info = await sdk(`Secret.getInfo(${ref})`, () => Secret.getInfo(ref))
      assert.deepEqual(info, created)
    }
  })

  step('Secret.update(name, value) → version 2, same ID and metadata; update by ID with metadata → 3', async ({ sdk, exchanges }) => {
    const v2 = await sdk('Secret.update(name)', () => Secret.update(NAME, VALUES[1]))
    assert.equal(v2.version, 2)
    assert.equal(v2.secretId, created.secretId)
    assert.equal(v2.name, NAME)
    assert.deepEqual(v2.metadata, created.metadata, 'an update without metadata keeps it')
    assert.equal(v2.createdAt.getTime(), created.createdAt.getTime())
    assert.ok(v2.updatedAt >= created.updatedAt)
    const ex = one(exchanges(), 'POST', new RegExp(`^/secrets/${encodeURIComponent(NAME).replace(/\./g, '\\.')}$`))
    assert.equal(ex.status, 200)
    const v3 = await sdk('Secret.update(id, {metadata})', () => Secret.update(created.secretId, VALUES[2], { metadata: { owner: 'ops' } }))
    assert.equal(v3.version, 3)
    assert.deepEqual(v3.metadata, { owner: 'ops' })
    assert.equal((await sdk('Secret.getInfo', () => Secret.getInfo(NAME))).version, 3)
  })

  step('Secret.update / getInfo of a missing secret → SecretNotFoundError', async ({ sdk }) => {
    for (const [label, f] of [
      ['Secret.update(missing)', () => Secret.update(`missing.${RUN}`, 'x-VALUE')],
      ['Secret.getInfo(missing)', () => Secret.getInfo(`missing.${RUN}`)],
      ['Secret.getInfo(unknown id)', () => Secret.getInfo('sec_00000000000000000000')],
    ]) {
      const err = await rejects(sdk(label, f), label)
      assert.ok(err instanceof SecretNotFoundError, `${label}: expected SecretNotFoundError, got ${err?.name}: ${err?.message}`)
    }
  })

  step('Secret.list() → .nextItems() contains it; limit 2 pages by name with x-next-token', async ({ sdk, exchanges }) => {
    for (const n of PAGE_NAMES) await sdk(`Secret.create(${n})`, () => Secret.create(n, PAGE_VALUE(n)))
    const all = []
    const p = Secret.list()
    while (p.hasNext) all.push(...await sdk('Secret.list().nextItems()', () => p.nextItems()))
    const mine = all.find((s) => s.name === NAME)
    assert.ok(mine, `Secret.list() lacks ${NAME}: ${all.map((s) => s.name).join(', ')}`)
    assert.equal(mine.secretId, created.secretId)
    assert.equal(mine.version, 3)
    assert.deepEqual(mine.metadata, { owner: 'ops' })
    assert.ok(mine.createdAt instanceof Date && mine.updatedAt instanceof Date)

    const paged = []
    const pages = []
    const p2 = Secret.list({ limit: 2 })
    while (p2.hasNext) {
      const items = await sdk('Secret.list({limit: 2}).nextItems()', () => p2.nextItems())
      assert.ok(items.length >= 1 && items.length <= 2, `a page of ${items.length}`)
      pages.push(items.length)
      paged.push(...items.map((s) => s.name))
      assert.ok(pages.length <= 50, 'the paginator does not end')
    }
    assert.deepEqual(paged, all.map((s) => s.name), 'pages of 2 list the same secrets in the same order')
    assert.deepEqual(paged, [...paged].sort(), 'listed by name')
    for (const n of [...PAGE_NAMES, NAME]) assert.ok(paged.includes(n), `paged list lacks ${n}`)
    const lists = matching(exchanges(), 'GET', /^\/secrets\?limit=2/)
    assert.ok(lists.length >= 2)
    assert.ok(lists.slice(0, -1).every((x) => x.resHeaders['x-next-token']), 'every page but the last has x-next-token')
    assert.equal(lists.at(-1).resHeaders['x-next-token'], undefined, 'the last page has no x-next-token')
  })

  step('Secret.exists → true for name and ID, false for a missing name', async ({ sdk }) => {
    assert.equal(await sdk('Secret.exists(name)', () => Secret.exists(NAME)), true)
    assert.equal(await sdk('Secret.exists(id)', () => Secret.exists(created.secretId)), true)
    assert.equal(await sdk('Secret.exists(missing)', () => Secret.exists(`missing.${RUN}`)), false)
  })

  step('Secret.fill(name) is the ${e2b.secrets.<name>} placeholder', () => {
    assert.equal(Secret.fill(NAME), `\${e2b.secrets.${NAME}}`)
  })

  step('a non-admin key gets SecretError 403 (secrets are admin-only on cella)', async ({ sdk }) => {
    const r = await fetch(`${DAEMON_URL}/keys`, {
      method: 'POST',
      headers: { 'X-API-Key': ADMIN_KEY, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name: `secrets-compat-${RUN}` }),
    })
    assert.equal(r.status, 201, `POST /keys: ${r.status} ${await r.clone().text()}`)
    const { key } = await r.json()
    for (const [label, f] of [
      ['Secret.create (user key)', () => Secret.create(`user.${RUN}`, 'user-VALUE', { apiKey: key })],
      ['Secret.update (user key)', () => Secret.update(NAME, 'user-VALUE', { apiKey: key })],
      ['Secret.list (user key)', () => Secret.list({ apiKey: key }).nextItems()],
      ['Secret.destroy (user key)', () => Secret.destroy(NAME, { apiKey: key })],
    ]) {
      const err = await rejects(sdk(label, f), label)
      assert.ok(err instanceof SecretError && /^403: .*admin key/.test(err.message), `${label}: ${err?.name}: ${err?.message}`)
    }
    assert.equal((await sdk('Secret.getInfo', () => Secret.getInfo(NAME))).version, 3, 'a user key changed the secret')
  })

  step('Secret.destroy → true, then false; the secret is gone by name and ID', async ({ sdk, exchanges }) => {
    assert.equal(await sdk('Secret.destroy(name)', () => Secret.destroy(NAME)), true)
    assert.equal(one(exchanges(), 'DELETE', /^\/secrets\//).status, 204)
    assert.equal(await sdk('Secret.destroy(name) again', () => Secret.destroy(NAME)), false)
    assert.equal(await sdk('Secret.destroy(id)', () => Secret.destroy(created.secretId)), false)
    assert.equal(await sdk('Secret.exists(id)', () => Secret.exists(created.secretId)), false)
    for (const n of PAGE_NAMES) assert.equal(await sdk(`Secret.destroy(${n})`, () => Secret.destroy(n)), true)
  })

  step('no answer to any /secrets request carried a value', () => {
    const all = proxy.since(markAtStart).filter((x) => x.url.startsWith('/secrets'))
    assert.ok(all.length >= 20, `only ${all.length} /secrets exchanges recorded`)
    const values = [...VALUES, 'clobber-VALUE', 'x-VALUE', 'user-VALUE', ...PAGE_NAMES.map(PAGE_VALUE)]
    for (const x of all) {
      const text = x.resBody.text(x.resHeaders['content-encoding'])
      assert.ok(text !== null, `${x.method} ${x.url}: answer too long to check whole (${x.resBody.total} B)`)
      for (const v of values) assert.ok(!text.includes(v), `${x.method} ${x.url} answered a value: ${text}`)
      assert.ok(!/"value"/.test(text), `${x.method} ${x.url} has a value field: ${text}`)
    }
    // The requests did carry them: the check above looked at the right bodies.
    assert.ok(all.some((x) => x.method === 'POST' && (x.reqBody.text() ?? '').includes(VALUES[0])))
  })
})

after(closeProxy)
