// The real E2B CLI (@e2b/cli 2.19.0, pinned in the lockfile) against cella:
// its sandbox commands, each run as a user runs them, pointed at the daemon
// by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL (the logging proxy, as for
// the SDKs). `sandbox connect` gets a real terminal from util-linux's
// script(1).
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { createRequire } from 'node:module'
import path from 'node:path'
import { step, waitFor, sandboxJanitor, closeProxy, proxy, ADMIN_KEY } from './lib/harness.mjs'

const { Sandbox } = await import('e2b-2.51.0')
const require = createRequire(import.meta.url)
const CLI = path.join(path.dirname(require.resolve('@e2b/cli-2.19.0/package.json')), 'dist', 'index.js')
const RUN = `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`

const cliEnv = () => ({
  PATH: process.env.PATH,
  HOME: process.env.HOME,
  E2B_API_KEY: ADMIN_KEY,
  E2B_API_URL: proxy.url,
  E2B_SANDBOX_URL: proxy.url,
  NO_COLOR: '1',
  TERM: 'xterm',
})

// Runs the CLI (through script(1) when tty): { code, stdout, stderr }.
function cli (args, { input, tty = false, timeout = 60_000 } = {}) {
  proxy.label = `e2b ${args.join(' ')}`
  const cmd = tty ? 'script' : process.execPath
  const argv = tty
    ? ['-qefc', [process.execPath, CLI, ...args].map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(' '), '/dev/null']
    : [CLI, ...args]
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, argv, { env: cliEnv(), stdio: ['pipe', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d) => { stdout += d })
    child.stderr.on('data', (d) => { stderr += d })
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`e2b ${args.join(' ')}: no exit within ${timeout} ms; stdout ${stdout} stderr ${stderr}`)) }, timeout)
    child.on('error', reject)
    child.on('close', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }) })
    // A failing input script fails the call (and stops the CLI) instead of
    // leaving an unhandled rejection and a CLI waiting for input.
    if (input !== undefined) {
      Promise.resolve().then(() => input(child.stdin, () => stdout)).catch((e) => {
        clearTimeout(timer); child.kill('SIGKILL'); reject(e)
      })
    } else child.stdin.end()
  })
}

describe('@e2b/cli 2.19.0 sandbox commands', () => {
  const janitor = sandboxJanitor(Sandbox)
  let a, b
  const META = { suite: 'cella-e2b-compat', run: RUN }

  step('sandbox list (-s, -m, -f json) shows the sandboxes the filters select', async ({ sdk }) => {
    ;[a, b] = await sdk('Sandbox.create() ×2', () => Promise.all([
      Sandbox.create({ metadata: { ...META, role: 'a' }, timeoutMs: 300_000 }),
      Sandbox.create({ metadata: { ...META, role: 'b' }, timeoutMs: 300_000 }),
    ]))
    janitor.track(a); janitor.track(b)
    const all = await cli(['sandbox', 'list', '-s', 'running', '-m', `run=${RUN}`, '-f', 'json'])
    assert.equal(all.code, 0, all.stderr)
    const ids = JSON.parse(all.stdout).map((s) => s.sandboxId).sort()
    assert.deepEqual(ids, [a.sandboxId, b.sandboxId].sort())
    const one = await cli(['sandbox', 'list', '-m', `role=a,run=${RUN}`, '-f', 'json'])
    assert.equal(one.code, 0, one.stderr)
    assert.deepEqual(JSON.parse(one.stdout).map((s) => s.sandboxId).filter((id) => id === a.sandboxId || id === b.sandboxId), [a.sandboxId])
    const pretty = await cli(['sandbox', 'list', '-m', `run=${RUN}`])
    assert.equal(pretty.code, 0, pretty.stderr)
    assert.ok(pretty.stdout.includes(a.sandboxId) && pretty.stdout.includes(b.sandboxId), pretty.stdout)
  })

  step('sandbox info (-f json)', async () => {
    const r = await cli(['sandbox', 'info', a.sandboxId, '-f', 'json'])
    assert.equal(r.code, 0, r.stderr)
    const info = JSON.parse(r.stdout)
    assert.equal(info.sandboxId, a.sandboxId)
    assert.equal(info.state, 'running')
    assert.equal(info.envdVersion, '0.6.4')
    assert.equal(info.metadata.role, 'a')
    const missing = await cli(['sandbox', 'info', 'nosuchsandbox0000000'])
    assert.equal(missing.code, 1)
    assert.match(missing.stderr, /wasn't found/)
  })

  step('sandbox exec keeps the exit code, stdout, stderr, -u and -c; piped stdin reaches the command', async () => {
    const r = await cli(['sandbox', 'exec', a.sandboxId, 'sh', '-c', 'echo out; echo err >&2; exit 3'])
    assert.equal(r.code, 3, r.stderr)
    assert.equal(r.stdout, 'out\n')
    assert.match(r.stderr, /err/)
    const root = await cli(['sandbox', 'exec', '-u', 'root', '-c', '/tmp', a.sandboxId, 'sh', '-c', 'id -un; pwd'])
    assert.equal(root.code, 0, root.stderr)
    assert.equal(root.stdout, 'root\n/tmp\n')
    const piped = await cli(['sandbox', 'exec', a.sandboxId, 'wc', '-c'], { input: (stdin) => stdin.end('12345') })
    assert.equal(piped.code, 0, piped.stderr)
    assert.equal(piped.stdout.trim(), '5')
  })

  step('sandbox connect: a real terminal (pty), exit ends it', async () => {
    const r = await cli(['sandbox', 'connect', a.sandboxId], {
      tty: true,
      timeout: 90_000,
      input: async (stdin, out) => {
        // Type once the shell's prompt is there, as a person would.
        await waitFor('the terminal to connect', () => /connecting to sandbox/i.test(out()), { timeout: 30_000 })
        await waitFor('a prompt', () => /[$#]\s*$/.test(out()), { timeout: 30_000 }).catch(() => {})
        stdin.write('echo CONNECT_$((6*7)); tty; stty size\r')
        await waitFor('the command output', () => out().includes('CONNECT_42'), { timeout: 30_000 })
        stdin.write('exit\r')
      },
    })
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`)
    assert.match(r.stdout, /CONNECT_42/)
    assert.match(r.stdout, /\/dev\/pts\/\d+/)
  }, { timeout: 100_000 })

  step('sandbox metrics (--format json)', async () => {
    const r = await waitFor('a metrics sample', async () => {
      const x = await cli(['sandbox', 'metrics', a.sandboxId, '--format', 'json'])
      assert.equal(x.code, 0, x.stderr)
      return x.stdout.split('\n').some((l) => l.startsWith('{')) && x
    }, { timeout: 60_000, interval: 1000 })
    const sample = JSON.parse(r.stdout.split('\n').find((l) => l.startsWith('{')))
    assert.equal(typeof sample.cpuUsedPct, 'number')
    assert.ok(sample.memTotal > 0, JSON.stringify(sample))
  }, { timeout: 80_000 })

  step('sandbox logs: E2B\'s structured lines (pretty and --format json, --loggers)', async () => {
    const r = await cli(['sandbox', 'logs', a.sandboxId, '--format', 'json'])
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`)
    const lines = r.stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
    assert.ok(lines.length > 0, r.stdout)
    const created = lines.find((l) => l.logger === 'lifecycle')
    assert.ok(created, `no lifecycle line: ${r.stdout}`)
    assert.equal(created.level, 'info')
    assert.match(created.message, /^lifecycle/)
    assert.ok(lines.some((l) => l.logger === 'process.start'), 'the exec above is in the log')
    const only = await cli(['sandbox', 'logs', a.sandboxId, '--format', 'json', '--loggers', 'process'])
    const onlyLines = only.stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
    assert.ok(onlyLines.length > 0 && onlyLines.every((l) => l.logger.startsWith('process')), only.stdout)
    const pretty = await cli(['sandbox', 'logs', a.sandboxId])
    assert.equal(pretty.code, 0, pretty.stderr)
    assert.match(pretty.stdout, /Logs for sandbox/)
    assert.match(pretty.stdout, /INFO/)
  })

  step('sandbox logs --follow streams new lines and stops when the sandbox is killed', async ({ sdk }) => {
    const f = janitor.track(await sdk('Sandbox.create()', () => Sandbox.create({ metadata: { ...META, role: 'follow' }, timeoutMs: 120_000 })))
    let marked = false
    const r = await cli(['sandbox', 'logs', f.sandboxId, '--follow', '--format', 'json'], {
      timeout: 90_000,
      input: async (stdin, out) => {
        stdin.end()
        await waitFor('the lifecycle line', () => out().includes('"logger":"lifecycle"'), { timeout: 30_000 })
        await f.commands.run('echo followed-marker')
        await waitFor('the new process.start line', () => out().includes('followed-marker'), { timeout: 30_000 })
        marked = true
        await Sandbox.kill(f.sandboxId)
      },
    })
    assert.ok(marked, r.stdout)
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`)
  }, { timeout: 100_000 })

  step('sandbox pause / resume', async () => {
    const p = await cli(['sandbox', 'pause', b.sandboxId], { timeout: 120_000 })
    assert.equal(p.code, 0, p.stderr)
    const paused = JSON.parse((await cli(['sandbox', 'info', b.sandboxId, '-f', 'json'])).stdout)
    assert.equal(paused.state, 'paused')
    const listed = await cli(['sandbox', 'list', '-s', 'paused', '-m', `run=${RUN}`, '-f', 'json'])
    assert.deepEqual(JSON.parse(listed.stdout).map((s) => s.sandboxId), [b.sandboxId])
    const r = await cli(['sandbox', 'resume', b.sandboxId], { timeout: 120_000 })
    assert.equal(r.code, 0, r.stderr)
    const running = JSON.parse((await cli(['sandbox', 'info', b.sandboxId, '-f', 'json'])).stdout)
    assert.equal(running.state, 'running')
    const x = await cli(['sandbox', 'exec', b.sandboxId, 'echo', 'back'])
    assert.equal(x.stdout, 'back\n')
  }, { timeout: 150_000 })

  step('sandbox snapshot create / list', async ({ sdk }) => {
    const name = `snap-${RUN}`
    const c = await cli(['sandbox', 'snapshot', 'create', a.sandboxId, '-n', name], { timeout: 120_000 })
    assert.equal(c.code, 0, c.stderr)
    const id = c.stdout.match(/Created snapshot (\S+) from sandbox/)?.[1]
    assert.ok(id, c.stdout)
    try {
      const l = await cli(['sandbox', 'snapshot', 'list', a.sandboxId, '-f', 'json'])
      assert.equal(l.code, 0, l.stderr)
      const snaps = JSON.parse(l.stdout)
      assert.ok(snaps.some((s) => s.snapshotId === id), l.stdout)
    } finally {
      await sdk(`Sandbox.deleteSnapshot('${id}')`, () => Sandbox.deleteSnapshot(id))
    }
  }, { timeout: 150_000 })

  step('sandbox kill', async () => {
    const k = await cli(['sandbox', 'kill', a.sandboxId, b.sandboxId])
    assert.equal(k.code, 0, k.stderr)
    const left = await cli(['sandbox', 'list', '-s', 'running,paused', '-m', `run=${RUN}`, '-f', 'json'])
    assert.deepEqual(JSON.parse(left.stdout), [])
  })
})

after(() => closeProxy())
