// cella code-interpreter driver for JavaScript (Node.js): one long-lived
// vm context per code context, so globals and top-level let/const survive
// between cells. Protocol as in the Python driver: JSON commands on fd 3,
// JSON events on fd 4, the cell's console output on fds 1 and 2 followed by
// a marker after each cell.
'use strict'
const fs = require('fs')
const vm = require('vm')
const util = require('util')
const path = require('path')
const { createRequire } = require('module')

const MARK = `\x00cella-cell-end-${process.env.CELLA_CI_MARK || ''}\x00`
delete process.env.CELLA_CI_MARK
// The typescript context: each cell's types are stripped by esbuild (no
// type checking, as in E2B's TypeScript kernel), then it runs as JavaScript.
const typescript = process.env.CELLA_CI_TYPESCRIPT === '1'
delete process.env.CELLA_CI_TYPESCRIPT
const emit = (obj) => fs.writeSync(4, JSON.stringify(obj) + '\n')

// A SIGINT outside a synchronous run (vm's breakOnSigint handles those)
// interrupts the promise a cell is awaiting; it never kills the driver.
let interruptPending = null
process.on('SIGINT', () => { if (interruptPending) interruptPending() })

const cwd = process.cwd()
const userRequire = createRequire(path.join(cwd, '__cella_cell__.js'))
const sandbox = {
  console, process, Buffer, require: userRequire, module: { exports: {} },
  __dirname: cwd, __filename: path.join(cwd, '__cella_cell__.js'),
  setTimeout, clearTimeout, setInterval, clearInterval, setImmediate, clearImmediate,
  queueMicrotask, URL, URLSearchParams, TextEncoder, TextDecoder, AbortController,
  structuredClone: globalThis.structuredClone, fetch: globalThis.fetch,
  performance: globalThis.performance, atob, btoa,
}
sandbox.exports = sandbox.module.exports
sandbox.global = sandbox
sandbox.globalThis = sandbox
const context = vm.createContext(sandbox)
let count = 0

function bundle (value) {
  const data = {}
  if (value && typeof value === 'object' && typeof value._repr_mimebundle_ === 'function') {
    try { Object.assign(data, value._repr_mimebundle_()) } catch {}
  }
  if (!('text/plain' in data)) data['text/plain'] = util.inspect(value, { depth: 4 })
  return data
}

function errorEvent (e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e && 'message' in e)) {
    return { type: 'error', name: e.name || 'Error', value: String(e.message ?? ''), traceback: String(e.stack ?? '') }
  }
  return { type: 'error', name: 'Error', value: util.inspect(e), traceback: 'Uncaught ' + util.inspect(e) }
}

function stripTypes (code) {
  const r = require('child_process').spawnSync('esbuild', ['--loader=ts', '--log-level=error', '--color=false'], { input: code, encoding: 'utf8' })
  if (r.error) throw r.error
  if (r.status !== 0) {
    const msg = String(r.stderr).replace(/^\s*(✘ )?\[ERROR\] /, '').trim()
    throw Object.assign(new SyntaxError(msg.split('\n')[0]), { stack: 'SyntaxError: ' + msg })
  }
  return r.stdout
}

function compile (code, filename) {
  if (typescript) code = stripTypes(code)
  try {
    return new vm.Script(code, { filename })
  } catch (e) {
    // Top-level await: run the cell as the body of an async function (its
    // declarations are then local to the cell). When the last line is an
    // expression on its own, it becomes the function's return value, so
    // `await f()` still shows its result.
    if (!(e instanceof SyntaxError && /await/.test(e.message))) throw e
    const lines = code.replace(/\s+$/, '').split('\n')
    const last = lines.pop().replace(/;\s*$/, '')
    try {
      return new vm.Script(`(async () => {\n${lines.join('\n')}\nreturn (${last}\n)\n})()`, { filename })
    } catch {
      return new vm.Script(`(async () => {\n${code}\n})()`, { filename })
    }
  }
}

async function execute (cmd) {
  count++
  const filename = `<cell-${count}>`
  Object.assign(process.env, cmd.env_base || {}) // the sandbox's env vars, for good
  const saved = {}
  for (const [k, v] of Object.entries(cmd.env_vars || {})) {
    saved[k] = process.env[k]
    process.env[k] = String(v)
  }
  try {
    const script = compile(cmd.code || '', filename)
    let value = script.runInContext(context, { breakOnSigint: true, displayErrors: false })
    if (value && typeof value.then === 'function') {
      value = await new Promise((resolve, reject) => {
        interruptPending = () => reject(Object.assign(new Error('Script execution interrupted.'), { name: 'KeyboardInterrupt' }))
        value.then(resolve, reject)
      })
    }
    if (value !== undefined) emit({ type: 'result', main: true, data: bundle(value) })
  } catch (e) {
    emit(errorEvent(e))
  } finally {
    interruptPending = null
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
  }
}

// An error thrown later by a timer or a promise nobody awaits must not end
// the context: it is reported on stderr, as Node's REPL does.
process.on('uncaughtException', (e) => { process.stderr.write('Uncaught ' + util.inspect(e) + '\n') })
process.on('unhandledRejection', (e) => { process.stderr.write('Unhandled rejection: ' + util.inspect(e) + '\n') })

const input = fs.createReadStream(null, { fd: 3 })
let buf = ''
let queue = Promise.resolve()
input.on('data', (chunk) => {
  buf += chunk.toString('utf8')
  let i
  while ((i = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, i)
    buf = buf.slice(i + 1)
    let cmd
    try { cmd = JSON.parse(line) } catch { continue }
    if (cmd.type !== 'execute') continue
    queue = queue.then(async () => {
      await execute(cmd)
      fs.writeSync(1, MARK)
      fs.writeSync(2, MARK)
      emit({ type: 'done' })
    })
  }
})
input.on('end', () => process.exit(0))
emit({ type: 'ready', pid: process.pid })
