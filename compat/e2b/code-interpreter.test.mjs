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

  step('issue 13: the python and javascript contexts exist from the start (listCodeContexts)', async ({ sdk }) => {
    const list = await sdk('listCodeContexts()', () => shared().listCodeContexts())
    const langs = list.map((c) => c.language).sort()
    assert.deepEqual(langs, ['javascript', 'python'], `contexts ${JSON.stringify(list)}`)
    for (const c of list) assert.equal(c.cwd, '/home/user')
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

  step('issue 13: IPython: an indented cell is dedented, !cmd streams, %magics work', async ({ sdk }) => {
    const s = shared()
    const ind = await sdk("runCode('\\n    a = 6\\n    a * 7')", () => s.runCode('\n    a = 6\n    a * 7\n'))
    assert.equal(ind.error, undefined, `error: ${JSON.stringify(ind.error)}`)
    assert.equal(ind.text, '42')
    const out = []
    const bang = await sdk("runCode('!pwd; echo err >&2')", () => s.runCode('!pwd; echo err >&2', { onStdout: (m) => out.push(m.line) }))
    assert.deepEqual(bang.logs.stdout, ['/home/user\n'])
    assert.deepEqual(out, ['/home/user\n'])
    assert.deepEqual(bang.logs.stderr, ['err\n'])
    const cap = await sdk("runCode('files = !ls /; \"etc\" in files')", () => s.runCode('files = !ls /\n"etc" in files'))
    assert.equal(cap.text, 'True')
    const cd = await sdk("runCode('%cd /tmp')", () => s.runCode('%cd /tmp'))
    assert.equal(cd.error, undefined, `error: ${JSON.stringify(cd.error)}`)
    assert.deepEqual(cd.logs.stdout, ['/tmp\n'])
    const pwd = await sdk("runCode('%pwd')", () => s.runCode('%pwd'))
    assert.equal(pwd.text, '/tmp')
    await sdk("runCode('%cd /home/user')", () => s.runCode('%cd /home/user'))
    const tm = await sdk("runCode('%%timeit -n1 -r1 ...')", () => s.runCode('%%timeit -n1 -r1\nsum(range(10))'))
    assert.match(tm.logs.stdout.join(''), /per loop/)
  })

  step('issue 13: IPython.display: display() and the formats of IPython\'s formatter; strings unquoted', async ({ sdk }) => {
    const s = shared()
    const e = await sdk('runCode(display(HTML, Markdown, SVG, Latex, Javascript), JSON)', () => s.runCode(
      'from IPython.display import display, HTML, Markdown, SVG, Latex, Javascript, JSON\n' +
      'display(HTML("<b>bold</b>"))\ndisplay(Markdown("# title"))\n' +
      'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>\'))\n' +
      'display(Latex(r"$x^2$"))\ndisplay(Javascript("console.log(1)"))\nJSON({"k": [1, 2]})'))
    assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
    assert.deepEqual(e.results.map((r) => [r.isMainResult, r.formats().filter((f) => f !== 'text')]),
      [[false, ['html']], [false, ['markdown']], [false, ['svg']], [false, ['latex']], [false, ['javascript']], [true, ['json']]])
    assert.equal(e.results[0].html, '<b>bold</b>')
    assert.equal(e.results[1].markdown, '# title')
    assert.match(e.results[2].svg, /^<svg/)
    assert.equal(e.results[3].latex, '$x^2$')
    assert.deepEqual(e.results[5].json, { k: [1, 2] })
    assert.equal((await sdk("runCode('\"double\"')", () => s.runCode('"double"'))).text, 'double')
    assert.equal((await sdk("runCode(\"'single'\")", () => s.runCode("'single'"))).text, 'single')
    assert.equal((await sdk("runCode('\"it\\'s\"')", () => s.runCode('"it\'s"'))).text, "it's")
    const d = await sdk("runCode('{\"a\": [1, None]}')", () => s.runCode('{"a": [1, None]}'))
    assert.deepEqual(d.results[0].json, { a: [1, null] })
    assert.equal(d.text, "{'a': [1, None]}")
    const err = await sdk("runCode('raise ValueError(\"bad\")')", () => s.runCode('raise ValueError("bad")'))
    assert.equal(err.error?.name, 'ValueError')
    assert.equal(err.error?.value, 'bad')
    assert.match(err.error?.traceback, /ValueError: bad/)
    assert.doesNotMatch(err.error?.traceback, /\x1b\[/, 'no terminal colours in the traceback')
    const n1 = (await sdk("runCode('1')", () => s.runCode('1'))).executionCount
    const n2 = (await sdk("runCode('1')", () => s.runCode('1'))).executionCount
    assert.equal(n2, n1 + 1)
  })

  step('issue 13: a PIL image saved to a file is displayed as png, as in E2B', async ({ sdk }) => {
    const e = await sdk("runCode(Image.new(...).save('red.png'))", () => shared().runCode(
      'from PIL import Image\nImage.new("RGB", (4, 4), "red").save("/tmp/red.png")'))
    assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
    assert.equal(e.results.length, 1)
    assert.equal(Buffer.from(e.results[0].png, 'base64').subarray(1, 4).toString(), 'PNG')
  })

  step('issue 13: a DataFrame carries e2b/data (result.data)', async ({ sdk }) => {
    const e = await sdk('runCode(pd.DataFrame) → data', () => shared().runCode(
      'import pandas as pd\npd.DataFrame({"a": [1, 2], "t": pd.to_datetime(["2024-01-02", "2024-01-03"])})'))
    assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
    assert.deepEqual(e.results[0].data, { a: [1, 2], t: ['2024-01-02T00:00:00', '2024-01-03T00:00:00'] })
  }, { timeout: 90_000 })

  // E2B's own chart cases (e2b-dev/code-interpreter js/tests/charts).
  // head: the chart's scalar fields that must be exactly so.
  const chartOf = async (sdk, what, code, head) => {
    const e = await sdk(`runCode(${what}; plt.show())`, () => shared().runCode('import matplotlib.pyplot as plt\n' + code + '\nplt.show()'))
    assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
    assert.equal(e.results.length, 1, `results: ${JSON.stringify(e.results.map((r) => r.formats()))}`)
    assert.ok(e.results[0].png && e.results[0].text.startsWith('<Figure size'))
    assert.deepEqual(e.results[0].extra, {})
    const c = e.results[0].chart
    assert.ok(c, 'no chart')
    assert.deepEqual(Object.fromEntries(Object.keys(head).map((k) => [k, c[k]])), head)
    return c
  }

  step('issue 13: result.chart of a line chart', async ({ sdk }) => {
    const c = await chartOf(sdk, 'plt.plot(dates, sin/cos)',
      'import numpy as np, datetime\ndates = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(100)]\n' +
      'x = np.linspace(0, 2 * np.pi, 100)\nplt.figure(figsize=(10, 6))\nplt.plot(dates, np.sin(x), label="sin(x)")\n' +
      'plt.plot(dates, np.cos(x), label="cos(x)")\nplt.xlabel("Time (s)")\nplt.ylabel("Amplitude (Hz)")\nplt.title("Plot of sin(x) and cos(x)")',
      { type: 'line', title: 'Plot of sin(x) and cos(x)', x_label: 'Time (s)', y_label: 'Amplitude (Hz)', x_unit: 's', y_unit: 'Hz', x_scale: 'datetime', y_scale: 'linear' })
    assert.ok(c.x_ticks.every((t) => typeof t === 'string' && !isNaN(new Date(t))))
    assert.ok(c.y_ticks.every((t) => typeof t === 'number'))
    assert.ok(c.x_tick_labels.every((l) => typeof l === 'string'))
    assert.deepEqual(c.elements.map((l) => [l.label, l.points.length]), [['sin(x)', 100], ['cos(x)', 100]])
    assert.deepEqual(c.elements[0].points[0], ['2023-09-01', 0])
    assert.ok(c.elements[1].points.every(([x, y]) => typeof x === 'string' && typeof y === 'number'))
  })

  step('issue 13: result.chart of a bar chart', async ({ sdk }) => {
    const c = await chartOf(sdk, 'plt.bar',
      'plt.figure(figsize=(10, 6))\nplt.bar(["Author A", "Author B", "Author C", "Author D"], [100, 200, 300, 400], label="Books Sold")\n' +
      'plt.xlabel("Authors")\nplt.ylabel("Number of Books Sold")\nplt.title("Book Sales by Authors")',
      { type: 'bar', title: 'Book Sales by Authors', x_label: 'Authors', y_label: 'Number of Books Sold', x_unit: null, y_unit: null })
    assert.deepEqual(c.elements, ['A', 'B', 'C', 'D'].map((a, i) => ({ label: `Author ${a}`, group: 'Books Sold', value: 100 * (i + 1) })))
  })

  step('issue 13: result.chart of a scatter chart', async ({ sdk }) => {
    const c = await chartOf(sdk, 'plt.scatter',
      'import numpy as np\nplt.xlabel("A")\nplt.ylabel("B")\n' +
      'plt.scatter(np.random.rand(5), np.random.rand(5), c="blue", label="Dataset 1")\nplt.scatter(np.random.rand(10), np.random.rand(10), c="red", label="Dataset 2")',
      { type: 'scatter', title: null, x_label: 'A', y_label: 'B' })
    assert.ok(c.x_ticks.every((t) => typeof t === 'number') && c.y_ticks.every((t) => typeof t === 'number'))
    assert.deepEqual(c.elements.map((d) => [d.label, d.points.length]), [['Dataset 1', 5], ['Dataset 2', 10]])
    assert.ok(c.elements.every((d) => d.points.every(([x, y]) => typeof x === 'number' && typeof y === 'number')))
  })

  step('issue 13: result.chart of a pie chart', async ({ sdk }) => {
    const c = await chartOf(sdk, 'ax.pie',
      'fig, ax = plt.subplots(figsize=(8, 8))\nplt.xlabel("x")\nplt.ylabel("y")\n' +
      'ax.pie([90, 10], labels=["No", "No, in blue"], autopct="%1.1f%%", startangle=90)\nax.axis("equal")\nplt.title("Will I wake up early tomorrow?")',
      { type: 'pie', title: 'Will I wake up early tomorrow?' })
    assert.deepEqual(c.elements, [{ label: 'No', angle: 324, radius: 1 }, { label: 'No, in blue', angle: 36, radius: 1 }])
  })

  step('issue 13: result.chart of a box-and-whisker chart', async ({ sdk }) => {
    const c = await chartOf(sdk, 'ax.boxplot',
      'data = {"Class A": [85, 90, 78, 92, 88], "Class B": [95, 89, 76, 91, 84, 87], "Class C": [75, 82, 88, 79, 86]}\n' +
      'fig, ax = plt.subplots(figsize=(10, 6))\nax.set_title("Exam Scores Distribution")\nax.set_xlabel("Class")\nax.set_ylabel("Score")\n' +
      'ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)\nplt.tight_layout()',
      { type: 'box_and_whisker', title: 'Exam Scores Distribution', x_label: 'Class', y_label: 'Score', x_unit: null, y_unit: null })
    assert.deepEqual(c.elements.map((b) => b.label), ['Class A', 'Class B', 'Class C'])
    assert.deepEqual(c.elements.map((b) => b.outliers), [[], [76], []])
    assert.deepEqual(c.elements.map((b) => b.min), [78, 84, 75])
    assert.deepEqual(c.elements.map((b) => b.first_quartile), [85, 84.75, 79])
    assert.deepEqual(c.elements.map((b) => b.median), [88, 88, 82])
    assert.deepEqual(c.elements.map((b) => b.third_quartile), [90, 90.5, 86])
    assert.deepEqual(c.elements.map((b) => b.max), [92, 95, 88])
  })

  step("issue 13: language 'bash', 'r' and 'ts' contexts; each starts in /home/user as in E2B's cwd tests", async ({ sdk }) => {
    const s = shared()
    const b = await sdk("runCode('pwd', {language: 'bash'})", () => s.runCode('pwd; N=41', { language: 'bash' }))
    assert.deepEqual(b.logs.stdout, ['/home/user\n'])
    const b2 = await sdk("runCode('echo $((N+1))', {language: 'bash'})", () => s.runCode('echo $((N+1)); false', { language: 'bash' }))
    assert.deepEqual(b2.logs.stdout, ['42\n'], 'bash keeps its variables')
    assert.equal(b2.error?.value, '1', 'a failing cell is an error with its exit status')
    const r = await sdk("runCode('getwd()', {language: 'r'})", () => s.runCode('getwd()', { language: 'r' }))
    assert.equal(r.error, undefined, `error: ${JSON.stringify(r.error)}`)
    assert.equal(r.results[0]?.text.trim(), '[1] "/home/user"')
    const rdf = await sdk("runCode('data.frame(a = 1:2)', {language: 'r'})", () => s.runCode('x <- 1:2\ndata.frame(a = x)', { language: 'r' }))
    assert.match(rdf.results[0]?.html ?? '', /<table/)
    const t = await sdk("runCode('process.cwd()', {language: 'ts'})", () => s.runCode('process.cwd()', { language: 'ts' }))
    assert.equal(t.text, '/home/user')
    await sdk("runCode('const n: number = 41', {language: 'typescript'})", () => s.runCode('interface P { n: number }\nconst p: P = { n: 41 }', { language: 'typescript' }))
    const t2 = await sdk("runCode('p.n + 1', {language: 'typescript'})", () => s.runCode('(p.n as number) + 1', { language: 'typescript' }))
    assert.equal(t2.text, '42')
    const js = await sdk("runCode('process.cwd()', {language: 'js'})", () => s.runCode('process.cwd()', { language: 'js' }))
    assert.equal(js.text, '/home/user')
    const ctx = await sdk("createCodeContext({language: 'r'})", () => s.createCodeContext({ language: 'r' }))
    assert.equal(ctx.language, 'r')
    await sdk('removeCodeContext(r)', () => s.removeCodeContext(ctx))
  }, { timeout: 120_000 })

  step('issue 13: an unsupported language and a cwd the user cannot enter are 400s naming why', async ({ sdk }) => {
    const s = shared()
    const lang = await rejects(sdk("createCodeContext({language: 'cobol'})", () => s.createCodeContext({ language: 'cobol', requestTimeoutMs: 5_000 })))
    assert.match(lang?.message ?? '', /400/)
    const hdr = { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json' }
    const res = await httpRequest({ method: 'POST', path: '/contexts', headers: hdr, body: JSON.stringify({ language: 'cobol' }) })
    assert.equal(res.status, 400)
    assert.match(JSON.parse(res.body).message, /supported: bash, javascript, python, r, typescript/)
    const ex = await rejects(sdk("runCode('1', {language: 'cobol'})", () => s.runCode('1', { language: 'cobol', requestTimeoutMs: 5_000 })))
    assert.match(ex?.message ?? '', /400/)
    const cwd = await httpRequest({ method: 'POST', path: '/contexts', headers: hdr, body: JSON.stringify({ cwd: '/root' }) })
    assert.equal(cwd.status, 400, cwd.body)
    assert.match(JSON.parse(cwd.body).message, /\/root.*may not enter/)
    const missing = await httpRequest({ method: 'POST', path: '/contexts', headers: hdr, body: JSON.stringify({ cwd: '/nonexistent' }) })
    assert.equal(missing.status, 400)
  })

  step('issue 13: the template has `python`, passwordless sudo for user, git and curl', async ({ sdk }) => {
    const s = shared()
    const e = await sdk("runCode('!python --version; sudo -n whoami; git --version; curl --version')", () => s.runCode(
      '!python --version && sudo -n whoami && git --version | cut -d" " -f1 && curl --version | head -c 4; echo'))
    assert.equal(e.error, undefined, `error: ${JSON.stringify(e.error)}`)
    assert.match(e.logs.stdout.join(''), /^Python 3\.\d+\.\d+\nroot\ngit\ncurl\n$/)
    const who = await sdk("commands.run('sudo -n id -u')", () => s.commands.run('sudo -n id -u'))
    assert.equal(who.stdout.trim(), '0')
    // sudo's root is the sandbox's own (gVisor's sentry): the agent that
    // cella mounted read-only stays out of its reach.
    const w = await sdk("commands.run('sudo -n sh -c \"echo x > /.cella/cella\"')", () => s.commands.run('sudo -n sh -c "echo x > /.cella/cella"').catch((e) => e))
    assert.notEqual(w.exitCode, 0)
    assert.match(w.stderr, /Read-only file system/)
  })

  step('step 16: a base sandbox runs no code interpreter (port 49999 → 502)', async ({ sdk }) => {
    const base = janitor.track(await sdk("Sandbox.create('base')", () => Sandbox.create('base')))
    const res = await httpRequest({ path: '/health', headers: { 'E2b-Sandbox-Id': base.sandboxId, 'E2b-Sandbox-Port': '49999' } })
    assert.equal(res.status, 502)
    const ps = await sdk("commands.run('ps -e -o comm=')", () => base.commands.run('ps -e -o comm='))
    assert.doesNotMatch(ps.stdout, /python|node/)
    const tools = await sdk("commands.run('python --version && sudo -n id -u && git --version && curl --version')", () =>
      base.commands.run('python --version && sudo -n id -u && git --version | cut -d" " -f1 && curl --version | head -c 4; echo'))
    assert.match(tools.stdout, /^Python 3\.\d+\.\d+\n0\ngit\ncurl\n$/, 'the base template has python, sudo for user, git and curl')
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
