// E2B desktop conformance: the real, unmodified @e2b/desktop@2.4.0 SDK (on
// e2b@2.51.0) against a cella daemon. The SDK drives the `desktop` template
// over ordinary commands (Xvfb, startxfce4, scrot, xdotool, xrandr,
// gtk-launch, x11vnc, noVNC's novnc_proxy): these tests show each of them
// working under gVisor, the stream reached through cella's preview proxy,
// and its auth enforced. Run with ./run.sh, which starts the daemon.
//
// Everything waits for a condition (a window, a file, a changed region of
// the screen) with a deadline; no sleep is an assertion.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import { step, waitFor, httpRequest, sandboxJanitor, closeProxy, DAEMON_URL } from './lib/harness.mjs'
import { pngHeader, decodePng, regionDiff, distinctColors } from './lib/png.mjs'
import { rfbGreeting } from './lib/rfb.mjs'

const { Sandbox, CommandExitError } = await import('@e2b/desktop-2.4.0')

const daemon = new URL(DAEMON_URL)
// The stream URL is https://6080-<id>.<domain>/vnc.html, E2B's edge form;
// the daemon serves the same Host over plain HTTP.
const viaPreview = (url, headers = {}) => {
  const u = new URL(url)
  return httpRequest({ path: u.pathname + u.search, headers: { Host: u.host, ...headers } })
}
const wsTo = (sbx, port, opts = {}) => rfbGreeting({
  host: daemon.hostname, port: Number(daemon.port), ...opts,
  headers: { Host: sbx.getHost(port), ...(opts.headers ?? {}) },
})

// What listens on the host itself: TCP ports and abstract/unix socket paths.
function hostListeners () {
  const tcp = new Set()
  for (const f of ['/proc/net/tcp', '/proc/net/tcp6']) {
    for (const line of fs.readFileSync(f, 'utf8').split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/)
      if (cols[3] === '0A') tcp.add(parseInt(cols[1].split(':').pop(), 16)) // LISTEN
    }
  }
  const unix = new Set(fs.readFileSync('/proc/net/unix', 'utf8').split('\n').slice(1)
    .map((l) => l.trim().split(/\s+/)[7]).filter(Boolean))
  return { tcp, unix }
}

// What the sandbox's stream processes say, appended to any failure of a
// stream step: tells a VNC server that refused from one that died, a proxy
// that never listened, and a sandbox short of memory or pids.
const streamState = (s) => quietly(() => s.commands.run([
  'ps -eo pid,pgid,sid,stat,rss,args', 'netstat -tln', 'ls -la /home/user/.vnc',
  'cat /sys/fs/cgroup/memory.current /sys/fs/cgroup/pids.current 2>&1',
  'tail -n 30 /tmp/novnc.log /tmp/x11vnc_stderr.log'].join('; echo; '), { user: 'root', timeoutMs: 20_000 }))
const explained = async (s, f) => {
  try { return await f() } catch (e) {
    const said = await streamState(s).catch((err) => ({ stdout: `(could not read: ${err.message})` }))
    e.message += `\n--- in the sandbox:\n${said?.stdout ?? '(could not read)'}`
    throw e
  }
}

// After stream.stop(): neither the VNC server nor noVNC's proxy (its
// websockify) is left, so the next stream.start() finds the ports free.
// stop() sends x11vnc only SIGTERM, whose handler runs x11vnc's X clean-up
// inside the signal handler; once in eight loaded runs it never returned
// (the process sleeping, the port still open). That is x11vnc's, not the
// sandbox's: then what it was doing is printed and it gets SIGKILL, which
// must end it.
const streamGone = async (s) => (await quietly(() => s.commands.run(
  `pgrep -x x11vnc || pgrep -f '[w]ebsockify' || netstat -tln | grep -E ':(5900|6080) '`))) === null
const streamStopped = async (s) => {
  try {
    await waitFor('x11vnc and websockify to stop', () => streamGone(s), { timeout: 10_000, interval: 300 })
    return
  } catch (e) {
    const said = await quietly(() => s.commands.run(
      'for p in $(pgrep -x x11vnc); do ps -o pid,stat,wchan:32,args -p $p; cat /proc/$p/task/*/stat; done; pkill -9 -x x11vnc', { user: 'root' }))
    console.error(`desktop: x11vnc outlived stream.stop()'s SIGTERM by 10 s; killed (SIGKILL):\n${said?.stdout ?? '(could not read)'}`)
  }
  await waitFor('x11vnc (after SIGKILL) and websockify to stop', () => streamGone(s), { timeout: 15_000, interval: 300 })
}

// A command the SDK runs that exits non-zero is a CommandExitError: a
// window query that finds nothing yet, while we wait for it.
const quietly = async (f) => { try { return await f() } catch (e) { if (e instanceof CommandExitError) return null; throw e } }
// The visible windows of an application's class, once there is one.
const waitForWindow = (s, cls, timeout = 60_000) => waitFor(`a visible ${cls} window`, async () => {
  const ids = (await quietly(() => s.getApplicationWindows(cls)))?.filter(Boolean)
  return ids?.length > 0 && ids
}, { timeout, interval: 500 })

describe('@e2b/desktop@2.4.0', () => {
  const janitor = sandboxJanitor(Sandbox)
  let sbx
  const shared = () => { assert.ok(sbx, 'no shared sandbox: Sandbox.create failed'); return sbx }
  const before = hostListeners()

  step('Sandbox.create() asks for the desktop template and starts Xvfb and Xfce in it', async ({ sdk }) => {
    // The first create builds the template (Debian packages; minutes on a
    // machine that never built it).
    sbx = await sdk('Sandbox.create({timeoutMs})', () => Sandbox.create({ timeoutMs: 900_000 }))
    janitor.track(sbx)
    const info = await sdk('sbx.getInfo()', () => sbx.getInfo())
    assert.equal(info.templateId ?? info.name, 'desktop')
    const ps = await sdk("commands.run('pgrep -a ...')", () => sbx.commands.run('pgrep -x Xvfb && pgrep -x xfce4-session && pgrep -x xfwm4'))
    assert.equal(ps.stdout.trim().split('\n').length, 3, ps.stdout)
  }, { timeout: 1_500_000 })

  step('getScreenSize() is the 1024x768 screen; screenshot() is a PNG of that size with something drawn on it', async ({ sdk }) => {
    const s = shared()
    const size = await sdk('getScreenSize()', () => s.getScreenSize())
    assert.deepEqual(size, { width: 1024, height: 768 })
    const png = await sdk('screenshot()', () => s.screenshot())
    assert.ok(png instanceof Uint8Array, `screenshot() returned ${typeof png}`)
    const hdr = pngHeader(png)
    assert.equal(hdr.width, size.width)
    assert.equal(hdr.height, size.height)
    assert.equal(decodePng(png).pixels.length, size.width * size.height * decodePng(png).channels)
    // Xfce paints its panels, icons and wallpaper a moment after its
    // processes are up (the first screenshot may be all black): a blank or
    // failed capture stays one colour.
    let colours = 0
    await waitFor('the desktop to be drawn', async () => {
      colours = distinctColors(decodePng(await s.screenshot()))
      return colours > 50
    }, { timeout: 30_000, interval: 500 })
  }, { timeout: 60_000 })

  step('moveMouse() / getCursorPosition(), drag() ends where it was dragged to, scroll() runs', async ({ sdk }) => {
    const s = shared()
    await sdk('moveMouse(123, 234)', () => s.moveMouse(123, 234))
    assert.deepEqual(await sdk('getCursorPosition()', () => s.getCursorPosition()), { x: 123, y: 234 })
    await sdk('drag([600, 400], [640, 420])', () => s.drag([600, 400], [640, 420]))
    assert.deepEqual(await s.getCursorPosition(), { x: 640, y: 420 })
    await sdk("scroll('down', 2)", () => s.scroll('down', 2))
    await sdk("scroll('up')", () => s.scroll('up'))
  }, { timeout: 60_000 })

  step('rightClick() on the desktop opens its menu: the region under the pointer changes in the next screenshot; Escape closes it', async ({ sdk }) => {
    const s = shared()
    const region = [520, 330, 700, 500] // right of and below the pointer, away from the panels' clock
    await sdk('moveMouse(512, 320)', () => s.moveMouse(512, 320))
    // A drawn desktop that holds still: two screenshots alike in the region.
    let before = decodePng(await s.screenshot())
    await waitFor('the desktop to be drawn and still', async () => {
      const next = decodePng(await s.screenshot())
      const still = distinctColors(next) > 50 && regionDiff(before, next, region) === 0
      before = next
      return still
    }, { timeout: 30_000, interval: 300 })
    // The click itself, without moving: only the menu can change the region.
    await sdk('rightClick()', () => s.rightClick())
    let changed = 0
    await waitFor('the desktop menu to be drawn', async () => {
      changed = regionDiff(before, decodePng(await s.screenshot()), region)
      return changed > 2000
    }, { timeout: 20_000, interval: 300 })
    await sdk("press('escape')", () => s.press('escape'))
    await waitFor('the desktop menu to close', async () => regionDiff(before, decodePng(await s.screenshot()), region) === 0,
      { timeout: 20_000, interval: 300 })
  }, { timeout: 90_000 })

  step('launch() a text editor, window queries, write() and press(ctrl+s): the text is in the file it saved', async ({ sdk }) => {
    const s = shared()
    const path = '/home/user/note.txt'
    const text = 'Hello from cella, typed by xdotool 42.'
    await sdk(`files.write('${path}', '')`, () => s.files.write(path, ''))
    await sdk(`launch('org.xfce.mousepad', '${path}')`, () => s.launch('org.xfce.mousepad', path))
    const [win] = await waitForWindow(s, 'mousepad')
    const title = await sdk(`getWindowTitle(${win})`, () => s.getWindowTitle(win))
    assert.match(title, /note\.txt/)
    // Focus it the way a user would: click into its text area.
    const geo = await s.commands.run(`xdotool getwindowgeometry --shell ${win}`)
    const g = Object.fromEntries(geo.stdout.trim().split('\n').map((l) => l.split('=')))
    await sdk('leftClick(<inside the editor>)', () => s.leftClick(Number(g.X) + Math.floor(g.WIDTH / 2), Number(g.Y) + Math.floor(g.HEIGHT / 2)))
    await waitFor('the editor to have the focus', async () => (await s.getCurrentWindowId()) === win, { timeout: 20_000, interval: 300 })
    await sdk(`write('${text}')`, () => s.write(text))
    await sdk("press(['ctrl', 's'])", () => s.press(['ctrl', 's']))
    const saved = await waitFor('the editor to save the file', async () => {
      const t = await s.files.read(path)
      return t.trim() === text && t
    }, { timeout: 30_000, interval: 300 })
    assert.equal(saved.trim(), text)
    await sdk("press(['ctrl', 'q'])", () => s.press(['ctrl', 'q']))
  }, { timeout: 120_000 })

  step('doubleClick() on the editor\'s title bar maximizes it (xfwm4)', async ({ sdk }) => {
    const s = shared()
    await sdk("launch('org.xfce.mousepad')", () => s.launch('org.xfce.mousepad'))
    const [win] = await waitForWindow(s, 'mousepad')
    // xdotool's geometry is off by the frame; xwininfo and the frame
    // extents xfwm4 sets say where the title bar is.
    const info = (await s.commands.run(`xwininfo -id ${win}; xprop -id ${win} _NET_FRAME_EXTENTS`)).stdout
    const num = (re) => Number(re.exec(info)?.[1])
    const x = num(/Absolute upper-left X:\s+(-?\d+)/)
    const y = num(/Absolute upper-left Y:\s+(-?\d+)/)
    const width = num(/Width:\s+(\d+)/)
    const top = num(/_NET_FRAME_EXTENTS\(CARDINAL\) = \d+, \d+, (\d+)/)
    assert.ok(width < 1024 && top > 0, `the editor opens narrower than the screen, framed: ${info}`)
    const state = async () => (await s.commands.run(`xprop -id ${win} _NET_WM_STATE`)).stdout
    assert.doesNotMatch(await state(), /MAXIMIZED/)
    await sdk('doubleClick(<title bar>)', () => s.doubleClick(x + Math.floor(width / 2), y - Math.floor(top / 2)))
    await waitFor('the editor to be maximized', async () => /_NET_WM_STATE_MAXIMIZED_HORZ/.test(await state()), { timeout: 20_000, interval: 300 })
    await s.commands.run(`xdotool windowkill ${win}`)
  }, { timeout: 120_000 })

  step('open() an HTML file: Firefox ESR shows it (its window title is the page\'s)', async ({ sdk }) => {
    const s = shared()
    await s.files.write('/home/user/page.html', '<!doctype html><title>cella desktop page</title><h1>hello</h1>')
    await sdk("open('/home/user/page.html')", () => s.open('/home/user/page.html'))
    // The first start of a Firefox profile takes a while under gVisor.
    let titles = []
    await waitFor('a Firefox window titled with the page', async () => {
      const wins = (await quietly(() => s.getApplicationWindows('firefox')))?.filter(Boolean) ?? []
      titles = await Promise.all(wins.map((w) => s.getWindowTitle(w)))
      return titles.some((t) => t.includes('cella desktop page'))
    }, { timeout: 120_000, interval: 1000 }).catch((e) => { e.message += ` (window titles: ${JSON.stringify(titles)})`; throw e })
    await s.commands.run('pkill -x firefox-esr || true')
  }, { timeout: 180_000 })

  step('stream.start() + getUrl(): the noVNC page answers through the preview proxy, and its WebSocket speaks VNC', async ({ sdk }) => {
    const s = shared()
    await explained(s, () => sdk('stream.start()', () => s.stream.start()))
    try {
      await explained(s, async () => {
        const url = await sdk('stream.getUrl()', () => s.stream.getUrl())
        const u = new URL(url)
        assert.equal(u.host, s.getHost(6080))
        assert.equal(u.pathname, '/vnc.html')
        assert.equal(u.searchParams.get('autoconnect'), 'true')
        assert.equal(new URL(s.stream.getUrl({ viewOnly: true })).searchParams.get('view_only'), 'true')
        const page = await viaPreview(url)
        assert.equal(page.status, 200, `GET ${url}: ${page.status} ${page.body.slice(0, 300)}`)
        assert.match(page.body, /<title>noVNC<\/title>/)
        const core = await viaPreview(new URL('/core/rfb.js', url).toString())
        assert.equal(core.status, 200, 'noVNC\'s RFB client is served with the page')
        const g = await wsTo(s, 6080)
        assert.equal(g.status, 101, `the WebSocket upgrade through the proxy: ${g.status} ${g.body}`)
        assert.equal(g.version, 'RFB 003.008\n')
        assert.ok(g.securityTypes.includes(1), `without requireAuth the stream is open (None offered): ${g.securityTypes}`)
        // The VNC port itself is no web server: the proxy reaches no VNC there.
        const raw = await wsTo(s, 5900)
        assert.notEqual(raw.status, 101, 'port 5900 does not upgrade to a WebSocket')
      })
    } finally {
      await sdk('stream.stop()', () => s.stream.stop())
    }
    await explained(s, () => streamStopped(s))
  }, { timeout: 90_000 })

  step('stream.start({requireAuth: true}): the auth key is in the URL, and VNC without it is refused', async ({ sdk }) => {
    const s = shared()
    await explained(s, () => sdk('stream.start({requireAuth: true})', () => s.stream.start({ requireAuth: true })))
    try {
      await explained(s, async () => {
        const key = s.stream.getAuthKey()
        assert.match(key, /^[A-Za-z0-9]{16}$/)
        const url = s.stream.getUrl({ authKey: key })
        assert.equal(new URL(url).searchParams.get('password'), key)
        const page = await viaPreview(url)
        assert.equal(page.status, 200, `GET ${url}: ${page.status} ${page.body.slice(0, 300)}`)
        const g = await wsTo(s, 6080, { tryAuth: true })
        assert.equal(g.status, 101, `${g.status} ${g.body}`)
        assert.deepEqual(g.securityTypes, [2], `only VNC authentication is offered (got ${g.securityTypes})`)
        assert.equal(g.authResult, 1, 'a response that is not the key\'s is refused')
      })
    } finally {
      await sdk('stream.stop()', () => s.stream.stop())
    }
    await explained(s, () => streamStopped(s))
  }, { timeout: 90_000 })

  step('nothing of the desktop listens on the host: no new TCP port, no X11 socket', async () => {
    const now = hostListeners()
    for (const port of [5900, 6000, 6080]) {
      assert.ok(!now.tcp.has(port) || before.tcp.has(port), `the host listens on ${port} now`)
    }
    const x11 = [...now.unix].filter((p) => /X11-unix|\.X0|vnc/i.test(p) && !before.unix.has(p))
    assert.deepEqual(x11, [], 'no X11 or VNC socket appeared on the host')
  })

  step('allowPublicTraffic: false: the noVNC and VNC ports answer 403 without the traffic token, the page with it', async ({ sdk }) => {
    const p = janitor.track(await sdk('Sandbox.create({network: {allowPublicTraffic: false}})',
      () => Sandbox.create({ network: { allowPublicTraffic: false }, timeoutMs: 300_000 })))
    assert.ok(p.trafficAccessToken, 'a private sandbox has a traffic access token')
    await sdk('stream.start()', () => p.stream.start())
    const url = p.stream.getUrl()
    const denied = await viaPreview(url)
    assert.equal(denied.status, 403, `without the token: ${denied.status} ${denied.body}`)
    for (const port of [6080, 5900]) {
      const g = await wsTo(p, port)
      assert.equal(g.status, 403, `a WebSocket to ${port} without the token: ${g.status}`)
    }
    const ok = await viaPreview(url, { 'e2b-traffic-access-token': p.trafficAccessToken })
    assert.equal(ok.status, 200)
    assert.match(ok.body, /<title>noVNC<\/title>/)
    await p.kill()
  }, { timeout: 240_000 })
})

after(closeProxy)
