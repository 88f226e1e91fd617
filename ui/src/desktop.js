// The live desktop of a sandbox of the desktop template, beside its
// terminal: noVNC's RFB client (bundled, @novnc/novnc) drawing the VNC
// stream that @e2b/desktop's stream.start() (or cella-desktop-stream,
// which the Start button runs) serves through websockify on port 6080,
// reached at the sandbox's preview host <port>-<id>.<domain> — the host of
// stream.getUrl(). Only the VNC protocol crosses: nothing the sandbox
// serves runs in the console's page (no frame of the sandbox's noVNC page,
// which would also need third-party storage). View-only unless
// "Interactive" is ticked; a stream started with requireAuth asks for its
// key. It takes the console's helpers as arguments rather than importing
// app.js, which imports it.
import RFB from '@novnc/novnc/core/rfb.js';

export const DESKTOP_TEMPLATE = 'desktop';
export const NOVNC_PORT = 6080;

// isDesktop says whether a sandbox runs on the desktop template.
export const isDesktop = (sb) => sb && (sb.templateID === DESKTOP_TEMPLATE || sb.alias === DESKTOP_TEMPLATE);

// streamURL is the WebSocket of sandbox sb's websockify at its preview
// host, on the console's own scheme and port (the daemon serves both).
export function streamURL(sb) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const port = location.port ? `:${location.port}` : '';
  return `${scheme}//${NOVNC_PORT}-${sb.sandboxID}.${sb.domain}${port}/websockify`;
}

// run runs a command in the sandbox as user through envd's process.Process/
// Start (a Connect server stream, JSON codec) and returns its exit code and
// output once it ends.
export async function run(envd, sb, cmd) {
  const msg = new TextEncoder().encode(JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', cmd] } }));
  const body = new Uint8Array(5 + msg.length);
  new DataView(body.buffer).setUint32(1, msg.length);
  body.set(msg, 5);
  const r = await envd(sb, '/process.Process/Start', {
    method: 'POST',
    headers: { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1', Authorization: `Basic ${btoa('user:')}` },
    body,
  });
  const buf = new Uint8Array(await r.arrayBuffer());
  const out = { exitCode: null, output: '' };
  const dec = new TextDecoder();
  for (let off = 0; off + 5 <= buf.length;) {
    const flags = buf[off];
    const len = new DataView(buf.buffer, off + 1, 4).getUint32(0);
    const frame = JSON.parse(dec.decode(buf.subarray(off + 5, off + 5 + len)) || '{}');
    off += 5 + len;
    if (flags & 2) { // end of stream: an error, or nothing
      if (frame.error) throw new Error(`${cmd}: ${frame.error.message || frame.error.code}`);
      continue;
    }
    const ev = frame.event || {};
    const data = ev.data || {};
    for (const s of [data.stdout, data.stderr]) if (s) out.output += dec.decode(Uint8Array.from(atob(s), (c) => c.charCodeAt(0)));
    if (ev.end) out.exitCode = ev.end.exitCode ?? 0;
  }
  return out;
}

// desktopPanel returns the panel of sandbox id: {el, update(sb), close()},
// update called with each GET /sandboxes/{id}. h builds elements, envd
// calls the sandbox's agent, base is the daemon's URL prefix (app.js).
export function desktopPanel(id, { h, envd, base }) {
  const status = h('span', { id: 'desktop-status', class: 'muted' }, 'checking the stream…');
  const startBtn = h('button', { id: 'desktop-start', class: 'small', hidden: true }, 'Start desktop');
  const interactive = h('input', { type: 'checkbox', id: 'desktop-interactive' });
  const screen = h('div', { id: 'desktop-view', class: 'desktop-view' });
  const keyInput = h('input', { type: 'password', id: 'desktop-key', placeholder: 'stream auth key', autocomplete: 'off' });
  const keyForm = h('form', { id: 'desktop-key-form', class: 'row', hidden: true },
    keyInput, h('button', { type: 'submit', class: 'small' }, 'Connect'));
  let sb = null;
  let rfb = null;
  let probing = false;

  const say = (text, cls = 'muted') => { status.className = cls; status.textContent = text; };
  const describe = () => say(interactive.checked ? 'live, interactive' : 'live, view only');
  const disconnect = () => {
    if (rfb) { const r = rfb; rfb = null; r.disconnect(); }
    screen.replaceChildren();
    keyForm.hidden = true;
  };

  function connect() {
    disconnect();
    say('connecting…');
    const r = new RFB(screen, streamURL(sb), { shared: true });
    rfb = r;
    r.viewOnly = !interactive.checked;
    r.scaleViewport = true;
    r.background = '#111';
    r.addEventListener('connect', () => { if (rfb === r) { describe(); screen.dataset.connected = 'true'; } });
    r.addEventListener('credentialsrequired', () => {
      if (rfb !== r) return;
      keyForm.hidden = false;
      say('the stream needs its auth key (stream.getAuthKey())');
    });
    r.addEventListener('securityfailure', (e) => { if (rfb === r) say(`refused: ${e.detail.reason || 'wrong key'}`, 'error'); });
    r.addEventListener('disconnect', (e) => {
      if (rfb !== r) return;
      rfb = null;
      delete screen.dataset.connected;
      say(e.detail.clean ? 'disconnected' : 'the stream ended', e.detail.clean ? 'muted' : 'error');
      startBtn.hidden = false;
      startBtn.textContent = 'Reconnect';
    });
  }
  keyForm.onsubmit = (ev) => {
    ev.preventDefault();
    if (rfb) rfb.sendCredentials({ password: keyInput.value });
    keyInput.value = '';
    keyForm.hidden = true;
  };

  // probe asks the noVNC port (by E2B's routing headers, from the
  // console's origin) whether the stream is up.
  async function probe() {
    if (probing || !sb) return false;
    probing = true;
    try {
      // Not envd(): the agent's access token is for the agent only, never
      // for what listens on the sandbox's other ports.
      const headers = { 'E2b-Sandbox-Id': sb.sandboxID, 'E2b-Sandbox-Port': String(NOVNC_PORT) };
      if (sb.trafficAccessToken) headers['E2b-Traffic-Access-Token'] = sb.trafficAccessToken;
      const up = await fetch(`${base}/vnc.html`, { headers, cache: 'no-store' }).then((r) => r.ok, () => false);
      startBtn.hidden = up;
      startBtn.textContent = 'Start desktop';
      if (!up) { say('the desktop stream is not running'); return false; }
      if (sb.trafficAccessToken) {
        // A browser's WebSocket cannot send the token header.
        say('running, but this sandbox does not allow public traffic: a browser cannot send its traffic token to the stream', 'error');
        return false;
      }
      connect();
      return true;
    } finally {
      probing = false;
    }
  }

  startBtn.onclick = async () => {
    startBtn.disabled = true;
    try {
      if (!(await probe()) && !sb.trafficAccessToken) {
        say('starting Xvfb, Xfce, x11vnc and noVNC…');
        const r = await run(envd, sb, 'cella-desktop-stream');
        if (r.exitCode !== 0) throw new Error(r.output.trim() || `exit code ${r.exitCode}`);
        await probe();
      }
    } catch (e) {
      say(`could not start the desktop: ${e.message}`, 'error');
    } finally {
      startBtn.disabled = false;
    }
  };
  interactive.onchange = () => {
    if (!rfb) return;
    rfb.viewOnly = !interactive.checked;
    describe();
  };

  const el = h('section', { class: 'card', id: 'desktop' },
    h('div', { class: 'section-head' }, h('h3', {}, 'Desktop'), status, h('span', { class: 'grow' }),
      h('label', { class: 'small-label', for: 'desktop-interactive' }, interactive, ' Interactive'), startBtn),
    keyForm, screen);

  let probed = false;
  return {
    el,
    update(next) {
      sb = next;
      if (sb.state !== 'running') {
        disconnect();
        probed = false;
        startBtn.hidden = true;
        return say(`the sandbox is ${sb.state}`);
      }
      if (!probed) { probed = true; probe(); }
    },
    close: disconnect,
  };
}
