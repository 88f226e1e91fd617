// E2B code-interpreter conformance: the real, unmodified
// @e2b/code-interpreter@2.8.0 SDK against a cella daemon (wire spec
// /work/shared/e2b-api.md §4 and §5 step 16). Run with ./run.sh, which
// starts the daemon.
//
// The tests share one code-interpreter-v1 sandbox (created in the first
// test; the daemon builds the template on first use, which takes minutes on
// a machine that has never built it) and run in order.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { step, rejects, httpRequest, sandboxJanitor, closeProxy, one } from './lib/harness.mjs'

const ci = await import('@e2b/code-interpreter-2.8.0')
const { Sandbox, NotFoundError, TimeoutError } = ci

describe('@e2b/code-interpreter@2.8.0', () => {
  const janitor = sandboxJanitor(Sandbox)
  let sbx
  const shared = () => { assert.ok(sbx, 'no shared sandbox: Sandbox.create failed'); return sbx }

  step('step 16: Sandbox.create() asks for code-interpreter-v1 and gets a sandbox', async ({ sdk, exchanges }) => {
    sbx = await sdk('Sandbox.create({envs})', () => Sandbox.create({ envs: { SANDBOX_VAR: 'from-create' }, timeoutMs: 600_000 }))
    janitor.track(sbx)
    const ex = one(exchanges(), 'POST', /^\/v2\/sandboxes$/)
    assert.equal(ex.status, 201)
  }, { timeout: 900_000 })

  step("step 16: runCode('1+1') → execution.text === '2' (POST /execute on port 49999 with the access token)", async ({ sdk, exchanges }) => {
    const execution = await sdk("sbx.runCode('1+1')", () => shared().runCode('1+1'))
    assert.equal(execution.text, '2')
    assert.equal(execution.error, undefined)
    assert.equal(execution.results.length, 1)
    assert.equal(execution.results[0].isMainResult, true)
    assert.equal(typeof execution.executionCount, 'number')
    const ex = one(exchanges(), 'POST', /^\/execute$/)
    assert.equal(ex.reqHeaders['e2b-sandbox-port'], '49999')
    assert.ok(ex.reqHeaders['x-access-token'], 'the SDK sends X-Access-Token on /execute')
    assert.match(ex.resHeaders['content-type'] ?? '', /ndjson/)
  })

  step('step 16: variables, imports and files persist across runCode calls', async ({ sdk }) => {
    const s = shared()
    await sdk("runCode('x = 40; import math; open(\"f.txt\", \"w\").write(\"hi\")')", () => s.runCode('x = 40\nimport math\nopen("f.txt", "w").write("hi")'))
    const e = await sdk("runCode('x + 2 ...')", () => s.runCode('x + math.floor(2.5) + len(open("f.txt").read()) - 2'))
    assert.equal(e.text, '42')
  })

  step('step 16: the sandbox env vars and per-call envs reach the code; it runs as user in /home/user', async ({ sdk }) => {
    const s = shared()
    const e = await sdk("runCode(..., {envs: {REQ_VAR}})", () => s.runCode(
      'import os, getpass\n"|".join([os.environ["SANDBOX_VAR"], os.environ["REQ_VAR"], getpass.getuser(), os.getcwd()])',
      { envs: { REQ_VAR: 'from-call' } }))
    assert.equal(e.text, 'from-create|from-call|user|/home/user')
    const after = await sdk("runCode('os.environ.get(\"REQ_VAR\")')", () => s.runCode('os.environ.get("REQ_VAR", "unset")'))
    assert.equal(after.text, 'unset', 'per-call envs are reset after the call')
  })

  step('step 16: createCodeContext / listCodeContexts / restartCodeContext / removeCodeContext; contexts are independent', async ({ sdk }) => {
    const s = shared()
    const a = await sdk('createCodeContext()', () => s.createCodeContext())
    const b = await sdk("createCodeContext({language: 'python', cwd: '/tmp'})", () => s.createCodeContext({ language: 'python', cwd: '/tmp' }))
    assert.ok(a.id && b.id && a.id !== b.id)
    assert.equal(a.language, 'python')
    assert.equal(a.cwd, '/home/user')
    assert.equal(b.cwd, '/tmp')

    await sdk("runCode('v = \"a\"', {context: a})", () => s.runCode('v = "a"', { context: a }))
    await sdk("runCode('v = \"b\"', {context: b})", () => s.runCode('v = "b"', { context: b }))
    assert.equal((await sdk("runCode('v', {context: a})", () => s.runCode('v', { context: a }))).text, 'a')
    assert.equal((await sdk("runCode('v', {context: b})", () => s.runCode('v', { context: b }))).text, 'b')
    assert.equal((await sdk("runCode('import os; os.getcwd()', {context: b})", () => s.runCode('import os\nos.getcwd()', { context: b }))).text, '/tmp')
    const dflt = await sdk("runCode('v') in the default context", () => s.runCode('v'))
    assert.equal(dflt.error?.name, 'NameError', 'the default context must not see another context\'s variables')

    const list = await sdk('listCodeContexts()', () => s.listCodeContexts())
    const ids = list.map((c) => c.id)
    assert.ok(ids.includes(a.id) && ids.includes(b.id), `list ${JSON.stringify(list)} lacks the new contexts`)
    for (const c of list) assert.ok(c.id && c.language && c.cwd, `bad context ${JSON.stringify(c)}`)

    await sdk('restartCodeContext(a)', () => s.restartCodeContext(a))
    const lost = await sdk("runCode('v', {context: a}) after restart", () => s.runCode('v', { context: a }))
    assert.equal(lost.error?.name, 'NameError', 'a restart clears the state')

    await sdk('removeCodeContext(a)', () => s.removeCodeContext(a))
    await sdk('removeCodeContext(b.id)', () => s.removeCodeContext(b.id))
    const after = (await sdk('listCodeContexts()', () => s.listCodeContexts())).map((c) => c.id)
    assert.ok(!after.includes(a.id) && !after.includes(b.id), 'removed contexts are not listed')
    // A short requestTimeoutMs: the SDK leaves its request timer running
    // when the answer is an error, which would keep node alive for 60 s.
    const err = await rejects(sdk("runCode('1', {context: removed})", () => s.runCode('1', { context: a, requestTimeoutMs: 3_000 })))
    assert.ok(err instanceof NotFoundError, `expected NotFoundError, got ${err?.name}: ${err?.message}`)
  })

  step('step 16: a matplotlib figure → a result with png', async ({ sdk }) => {
    const e = await sdk('runCode(plt.plot; plt.show())', () => shared().runCode(
      'import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("squares")\nplt.show()'))
    assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
    const pngs = e.results.filter((r) => r.png)
    assert.equal(pngs.length, 1, `results: ${JSON.stringify(e.results.map((r) => r.formats()))}`)
    assert.ok(pngs[0].formats().includes('png'))
    assert.equal(pngs[0].isMainResult, false)
    const png = Buffer.from(pngs[0].png, 'base64')
    assert.equal(png.subarray(1, 4).toString(), 'PNG')
    assert.deepEqual(e.logs.stderr, [], 'no warning about a non-interactive backend')
  }, { timeout: 90_000 })

  step('step 16: a pandas DataFrame as the last expression → html and text', async ({ sdk }) => {
    const e = await sdk('runCode(pd.DataFrame(...))', () => shared().runCode(
      'import pandas as pd\npd.DataFrame({"name": ["a", "b"], "score": [1, 2]})'))
    assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
    assert.equal(e.results.length, 1)
    const r = e.results[0]
    assert.equal(r.isMainResult, true)
    assert.match(r.html, /<table/)
    assert.match(r.text, /name\s+score/)
    assert.ok(r.formats().includes('html'))
    assert.equal(e.text, r.text)
  }, { timeout: 90_000 })

  step('step 16: an exception → execution.error with name, value and traceback', async ({ sdk }) => {
    let seen
    const e = await sdk('runCode(1/0)', () => shared().runCode('def f():\n    return 1 / 0\nf()', { onError: (err) => { seen = err } }))
    assert.equal(e.error?.name, 'ZeroDivisionError')
    assert.equal(e.error?.value, 'division by zero')
    assert.match(e.error?.traceback, /return 1 \/ 0/)
    assert.equal(seen?.name, 'ZeroDivisionError', 'onError is called')
    assert.equal(e.text, undefined)
  })

  step('step 16: onStdout receives a print while the code still runs', async ({ sdk }) => {
    // The code sleeps 4 s between its prints; streamed, the first reaches
    // onStdout about 4 s before runCode returns, buffered, right before it.
    // Requiring 2 s leaves 2 s for a slow delivery on a loaded machine.
    const t0 = Date.now()
    const got = []
    const e = await sdk('runCode(print; sleep 4; print, {onStdout})', () => shared().runCode(
      'import time\nprint("first", flush=True)\ntime.sleep(4)\nprint("second")',
      { onStdout: (m) => got.push({ line: m.line, at: Date.now() }) }))
    const returned = Date.now()
    assert.deepEqual(got.map((g) => g.line), ['first\n', 'second\n'])
    assert.deepEqual(e.logs.stdout, ['first\n', 'second\n'])
    const early = returned - got[0].at
    assert.ok(early >= 2000, `the first print reached onStdout only ${early} ms before runCode returned (after ${got[0].at - t0} ms, of ${returned - t0} ms): not streamed`)
  })

  step('step 16: timeoutMs interrupts `while True: pass`; the context keeps its state and works', async ({ sdk }) => {
    const s = shared()
    await sdk("runCode('kept = 7')", () => s.runCode('kept = 7'))
    const t0 = Date.now()
    const err = await rejects(sdk("runCode('while True: pass', {timeoutMs: 2000})", () => s.runCode('while True: pass', { timeoutMs: 2000 })))
    assert.ok(err instanceof TimeoutError, `expected TimeoutError, got ${err?.name}: ${err?.message}`)
    assert.ok(Date.now() - t0 < 10_000)
    const next = await sdk("runCode('kept')", () => s.runCode('kept', { timeoutMs: 20_000 }))
    assert.equal(next.text, '7')
  })

  step("step 16: language: 'javascript' keeps variables; console.log streams", async ({ sdk }) => {
    const s = shared()
    await sdk("runCode('let n = 41', {language: 'javascript'})", () => s.runCode('let n = 41', { language: 'javascript' }))
    const e = await sdk("runCode('n + 1', {language: 'javascript'})", () => s.runCode('n + 1', { language: 'javascript' }))
    assert.equal(e.text, '42')
    const out = []
    const l = await sdk("runCode('console.log(...)', {language: 'javascript'})", () => s.runCode('console.log("hi from node")', { language: 'javascript', onStdout: (m) => out.push(m.line) }))
    assert.deepEqual(l.logs.stdout, ['hi from node\n'])
    assert.deepEqual(out, ['hi from node\n'])
    const err = await sdk("runCode('null.x', {language: 'javascript'})", () => s.runCode('null.x', { language: 'javascript' }))
    assert.equal(err.error?.name, 'TypeError')
    const py = await sdk("runCode('x') back in python", () => s.runCode('x'))
    assert.equal(py.text, '40', 'the python default context is untouched')
  })

  step('step 16: a base sandbox runs no code interpreter (port 49999 → 502)', async ({ sdk }) => {
    const base = janitor.track(await sdk("Sandbox.create('base')", () => Sandbox.create('base')))
    const res = await httpRequest({ path: '/health', headers: { 'E2b-Sandbox-Id': base.sandboxId, 'E2b-Sandbox-Port': '49999' } })
    assert.equal(res.status, 502)
    const ps = await sdk("commands.run('ps -e -o comm=')", () => base.commands.run('ps -e -o comm='))
    assert.doesNotMatch(ps.stdout, /python|node/)
    await sdk('base.kill()', () => base.kill())
  }, { timeout: 120_000 })

  step('step 16: GET /health on port 49999 → 200', async () => {
    const res = await httpRequest({ path: '/health', headers: { 'E2b-Sandbox-Id': shared().sandboxId, 'E2b-Sandbox-Port': '49999' } })
    assert.equal(res.status, 200)
  })

  step('step 16: the sandbox is killed at the end', async ({ sdk }) => {
    assert.equal(await sdk('sbx.kill()', () => shared().kill()), true)
  })
})

after(closeProxy)
