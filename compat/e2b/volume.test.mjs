// E2B SDK conformance for volumes: the real, unmodified e2b@2.51.0 Volume
// class (Volume.create/connect/getInfo/list/destroy and the standalone file
// API with the volume token), volumeMounts at Sandbox.create, and the
// attacks a tenant can try through it: a symlink planted from inside a
// sandbox, another team's key and token. (A FIFO planted in a volume is
// internal/volume TestContentConfined's: gVisor keeps a sandbox's FIFOs in
// its own kernel, so the host never sees one.) run.sh starts the daemon; the
// harness points E2B_VOLUME_API_URL at it.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { step, rejects, one, jsonBody, matching, sandboxJanitor, teamKey, closeProxy } from './lib/harness.mjs'

const e2b = await import('e2b-2.51.0')
const { Volume, Sandbox, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } = e2b

const RUN = `r${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`
const NAME = `data-${RUN}`

describe('e2b@2.51.0 Volume', () => {
  const janitor = sandboxJanitor(Sandbox)
  let vol // the Volume of Volume.create
  const made = []
  after(async () => {
    for (const id of made) await Volume.destroy(id).catch(() => {})
  })

  step('Volume.create(name) → 201 VolumeAndToken: volumeId, name, token', async ({ sdk, exchanges }) => {
    vol = await sdk('Volume.create', () => Volume.create(NAME))
    made.push(vol.volumeId)
    assert.match(vol.volumeId, /^vol_[0-9a-f]{16}$/)
    assert.equal(vol.name, NAME)
    assert.match(vol.token, /^vtok_[A-Za-z0-9_-]{43}$/)
    const ex = one(exchanges(), 'POST', /^\/volumes$/)
    assert.equal(ex.status, 201)
    const body = jsonBody(ex)
    assert.equal(body.token, vol.token)
    assert.equal(body.domain, undefined, 'no domain: the SDK keeps E2B_VOLUME_API_URL')
    const dup = await rejects(Volume.create(NAME), 'a second Volume.create of the name')
    assert.ok(dup instanceof VolumeError, `${dup?.name}: ${dup?.message}`)
    assert.match(dup.message, /already exists/)
  })

  step('Volume.getInfo / connect → the same token; Volume.list lists it without a token', async ({ sdk, exchanges }) => {
    const info = await sdk('Volume.getInfo', () => Volume.getInfo(vol.volumeId))
    assert.deepEqual({ ...info }, { volumeId: vol.volumeId, name: NAME, token: vol.token, domain: undefined })
    const c = await sdk('Volume.connect', () => Volume.connect(vol.volumeId))
    assert.equal(c.token, vol.token)
    const list = await sdk('Volume.list', () => Volume.list())
    assert.ok(list.some((v) => v.volumeId === vol.volumeId && v.name === NAME), JSON.stringify(list))
    const ex = one(exchanges(), 'GET', /^\/volumes$/)
    assert.doesNotMatch(ex.resBody.toString(), /vtok_/, 'a list carries no token')
    const missing = await rejects(Volume.getInfo('vol_0000000000000000'), 'getInfo of an unknown volume')
    assert.ok(missing instanceof VolumeNotFoundError, `${missing?.name}: ${missing?.message}`)
  })

  step('writeFile / readFile (text, bytes, blob) with the volume token; getInfo of a file', async ({ sdk, exchanges }) => {
    const w = await sdk('vol.writeFile', () => vol.writeFile('/hello.txt', 'Hello, volume!\n'))
    assert.equal(w.name, 'hello.txt')
    assert.equal(w.path, '/hello.txt')
    assert.equal(w.type, 'file')
    assert.equal(w.size, 15)
    assert.equal(w.mode, 0o644)
    assert.equal(w.uid, 1000)
    assert.equal(w.gid, 1000)
    assert.ok(w.mtime instanceof Date && !isNaN(w.mtime))
    const put = one(exchanges(), 'PUT', /^\/volumecontent\/vol_[0-9a-f]+\/file\?path=%2Fhello\.txt/)
    assert.equal(put.status, 201)
    assert.equal(put.reqHeaders.authorization, `Bearer ${vol.token}`)
    assert.equal(await sdk('vol.readFile', () => vol.readFile('/hello.txt')), 'Hello, volume!\n')
    const bytes = new Uint8Array([0, 1, 2, 253, 254, 255])
    await vol.writeFile('/bin.dat', bytes.buffer)
    assert.deepEqual(await vol.readFile('/bin.dat', { format: 'bytes' }), bytes)
    const blob = await vol.readFile('/hello.txt', { format: 'blob' })
    assert.equal(await blob.text(), 'Hello, volume!\n')
    const info = await sdk('vol.getInfo', () => vol.getInfo('/hello.txt'))
    assert.equal(info.type, 'file')
    assert.equal(info.size, 15)
    await vol.writeFile('/meta.txt', 'x', { uid: 1001, gid: 1002, mode: 0o600 })
    const m = await vol.getInfo('/meta.txt')
    assert.deepEqual([m.uid, m.gid, m.mode], [1001, 1002, 0o600])
  })

  step('writeFile of an existing file: VolumeError 409 without force, overwritten with force', async ({ sdk }) => {
    const err = await rejects(sdk('vol.writeFile (again)', () => vol.writeFile('/hello.txt', 'clobber')), 'a second write without force')
    assert.ok(err instanceof VolumeError, `${err?.name}: ${err?.message}`)
    assert.match(err.message, /409.*already exists.*force/)
    assert.equal(await vol.readFile('/hello.txt'), 'Hello, volume!\n')
    await sdk('vol.writeFile({force:true})', () => vol.writeFile('/hello.txt', 'New content', { force: true }))
    assert.equal(await vol.readFile('/hello.txt'), 'New content')
  })

  step('makeDir (force: parents), list (depth), exists, updateMetadata, remove (recursive)', async ({ sdk }) => {
    const d = await sdk('vol.makeDir({force})', () => vol.makeDir('/nested/deep/dir', { force: true }))
    assert.equal(d.type, 'directory')
    assert.equal(d.path, '/nested/deep/dir')
    assert.equal(d.mode, 0o755)
    const again = await rejects(vol.makeDir('/nested'), 'makeDir of an existing directory')
    assert.match(again.message, /already exists/)
    const noParent = await rejects(vol.makeDir('/nope/child'), 'makeDir without its parent')
    assert.ok(noParent instanceof VolumePathNotFoundError, `${noParent?.name}: ${noParent?.message}`)
    await vol.writeFile('/nested/deep/dir/f.txt', 'deep')
    const top = await sdk("vol.list('/')", () => vol.list('/'))
    assert.deepEqual(top.map((e) => e.name), ['bin.dat', 'hello.txt', 'meta.txt', 'nested'])
    const deep = await sdk("vol.list('/nested', {depth: 3})", () => vol.list('/nested', { depth: 3 }))
    assert.deepEqual(deep.map((e) => e.path), ['/nested/deep', '/nested/deep/dir', '/nested/deep/dir/f.txt'])
    assert.equal(await sdk('vol.exists', () => vol.exists('/nested/deep/dir/f.txt')), true)
    assert.equal(await vol.exists('/nested/none'), false)
    const u = await sdk('vol.updateMetadata', () => vol.updateMetadata('/hello.txt', { uid: 1001, gid: 1001, mode: 0o755 }))
    assert.deepEqual([u.uid, u.gid, u.mode, u.path], [1001, 1001, 0o755, '/hello.txt'])
    const suid = await rejects(vol.updateMetadata('/hello.txt', { mode: 0o4755 }), 'a setuid mode')
    assert.match(suid.message, /01777/)
    const gone = await rejects(vol.updateMetadata('/none.txt', { mode: 0o644 }), 'updateMetadata of a missing path')
    assert.ok(gone instanceof VolumePathNotFoundError)
    await sdk('vol.remove(dir)', () => vol.remove('/nested'))
    assert.equal(await vol.exists('/nested'), false)
    const rm = await rejects(vol.remove('/nested'), 'remove of a missing path')
    assert.ok(rm instanceof VolumePathNotFoundError)
    const ls = await rejects(vol.list('/non-existent'), 'list of a missing directory')
    assert.ok(ls instanceof VolumePathNotFoundError)
  })

  step("Sandbox.create({volumeMounts: {'/mnt/data': volume}}) → the sandbox and the file API see each other's files", async ({ sdk }) => {
    const sbx = janitor.track(await sdk("Sandbox.create({volumeMounts:{'/mnt/data': vol}})",
      () => Sandbox.create({ volumeMounts: { '/mnt/data': vol }, timeoutMs: 120_000 })))
    const r = await sdk('commands.run(cat)', () => sbx.commands.run('cat /mnt/data/hello.txt; echo; stat -c %u:%g /mnt/data/bin.dat; echo from-sandbox > /mnt/data/sbx.txt'))
    assert.equal(r.stdout, 'New content\n1000:1000\n')
    assert.equal(await sdk('vol.readFile(sbx.txt)', () => vol.readFile('/sbx.txt')), 'from-sandbox\n')
    // Written through the file API while the sandbox runs: seen inside.
    await sdk('vol.writeFile (live)', () => vol.writeFile('/live.txt', 'written while mounted\n'))
    assert.equal((await sbx.commands.run('cat /mnt/data/live.txt')).stdout, 'written while mounted\n')
    await vol.remove('/live.txt')
    assert.equal((await sbx.commands.run('test -e /mnt/data/live.txt; echo $?')).stdout, '1\n')
    const info = await sbx.getInfo()
    assert.deepEqual(info.volumeMounts.map(({ name, path }) => ({ name, path })), [{ name: NAME, path: '/mnt/data' }])
    // By name, too.
    const byName = janitor.track(await Sandbox.create({ volumeMounts: { '/v': NAME }, timeoutMs: 60_000 }))
    assert.equal((await byName.commands.run('cat /v/sbx.txt')).stdout, 'from-sandbox\n')
    await byName.kill()
  }, { timeout: 120_000 })

  step('a symlink planted from inside a sandbox → the file API never follows it out of the volume', async ({ sdk }) => {
    const sbx = janitor.track(await Sandbox.create({ volumeMounts: { '/mnt/data': vol }, timeoutMs: 120_000 }))
    // /etc/hostname exists on the host and in the sandbox; ../.. from the
    // data dir is the volume's own directory on the host (its disk image).
    await sbx.commands.run('ln -s /etc/hostname /mnt/data/evil && ln -s ../.. /mnt/data/up && ln -s / /mnt/data/root', { user: 'root' })
    for (const p of ['/evil', '/up/disk.img', '/root/etc/hostname']) {
      const err = await rejects(sdk(`vol.readFile(${p})`, () => vol.readFile(p)), `reading ${p}`)
      assert.ok(err instanceof VolumeError, `${err?.name}: ${err?.message}`)
      assert.match(err.message, /403.*leads out of volume/, p)
      const werr = await rejects(vol.writeFile(p, 'pwned', { force: true }), `writing ${p}`)
      assert.match(werr.message, /403.*leads out of volume/, p)
    }
    const listed = await rejects(vol.list('/root'), 'listing through a symlink to /')
    assert.match(listed.message, /403/)
    const evil = await sdk('vol.getInfo(/evil)', () => vol.getInfo('/evil'))
    assert.deepEqual([evil.type, evil.target], ['symlink', '/etc/hostname'])
    await vol.remove('/evil') // the link, not /etc/hostname
    await vol.remove('/up')
    await vol.remove('/root')
    assert.equal((await sbx.commands.run('ls /mnt/data')).stdout, 'bin.dat\nhello.txt\nmeta.txt\nsbx.txt\n')
  }, { timeout: 120_000 })

  step("another team's key or token never reaches the volume (404, as an unknown volume)", async ({ sdk, exchanges }) => {
    const bobKey = await teamKey(`bob-${RUN}`, `blue-${RUN}`)
    const bobVol = await sdk('Volume.create (bob)', () => Volume.create(`bob-${RUN}`, { apiKey: bobKey }))
    made.push(bobVol.volumeId)
    const asBob = await rejects(Volume.getInfo(vol.volumeId, { apiKey: bobKey }), "getInfo of alice's volume with bob's key")
    assert.ok(asBob instanceof VolumeNotFoundError, `${asBob?.name}: ${asBob?.message}`)
    assert.equal(await Volume.destroy(vol.volumeId, { apiKey: bobKey }), false)
    assert.ok(!(await Volume.list({ apiKey: bobKey })).some((v) => v.volumeId === vol.volumeId))
    // Bob's token, bob's key and no token at all on alice's volume ID.
    for (const [who, token] of [["bob's token", bobVol.token], ["bob's key", bobKey], ['a made-up token', 'vtok_' + 'A'.repeat(43)]]) {
      const v = new Volume(vol.volumeId, NAME, token)
      const err = await rejects(sdk(`readFile with ${who}`, () => v.readFile('/hello.txt')), `readFile with ${who}`)
      assert.ok(err instanceof VolumePathNotFoundError, `${who}: ${err?.name}: ${err?.message}`)
      await rejects(v.writeFile('/x', 'pwned', { force: true }), `writeFile with ${who}`)
      await rejects(v.remove('/hello.txt'), `remove with ${who}`)
    }
    for (const ex of matching(exchanges(), 'GET', /^\/volumecontent\//)) assert.equal(ex.status, 404)
    // Alice's token does not open bob's volume either.
    const cross = new Volume(bobVol.volumeId, bobVol.name, vol.token)
    await rejects(cross.list('/'), "alice's token on bob's volume")
    assert.equal(await vol.readFile('/hello.txt'), 'New content', 'nothing changed')
    assert.equal(await vol.exists('/x'), false)
  })

  step('Volume.destroy → true, then false; the token no longer opens anything', async ({ sdk }) => {
    for (const id of janitor.ids) await Sandbox.kill(id).catch(() => {})
    assert.equal(await sdk('Volume.destroy', () => Volume.destroy(vol.volumeId)), true)
    assert.equal(await Volume.destroy(vol.volumeId), false)
    const err = await rejects(vol.readFile('/hello.txt'), 'readFile after destroy')
    assert.ok(err instanceof VolumePathNotFoundError, `${err?.name}: ${err?.message}`)
  })
})

after(() => closeProxy())
