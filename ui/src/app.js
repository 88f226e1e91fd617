// cella's web console: a small vanilla-JS app served by the daemon at /ui/.
// It talks to the same REST API as the CLI (X-API-Key), to the sandbox proxy
// for files and processes (E2b-Sandbox-Id / E2b-Sandbox-Port / X-Access-Token,
// as E2B's SDKs do), and to the PTY WebSocket for the terminal.
// The API key lives in sessionStorage only (gone when the tab closes).
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import './style.css';
import { lineChart, chartSVG } from './charts.js';
import { templatesView, snapshotsView, volumesView, poolsView, keysView, secretsView, hostView } from './pages.js';
import { buildView } from './build.js';
import { desktopPanel, isDesktop } from './desktop.js';

const KEY_STORAGE = 'cella.apiKey';
const ENVD_PORT = '49983';
export const REFRESH_MS = 3000;
// The daemon serves the console at <base>/ui/; the API is at <base>/.
const BASE = location.pathname.replace(/\/ui(\/.*)?$/, '');

const app = document.getElementById('app');
let leaveView = []; // cleanups of the current view

// ---------- helpers ----------

// h builds an element; children are nodes or strings (set as text, never HTML).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function key() {
  return sessionStorage.getItem(KEY_STORAGE) || '';
}

export function fmtAge(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr}h ${m % 60}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

export function fmtTime(t) {
  if (!t || t.startsWith('0001-')) return '—';
  return new Date(t).toLocaleString();
}

export function fmtBytes(n) {
  n = Number(n || 0);
  if (n < 1024) return `${n} B`;
  const u = ['KiB', 'MiB', 'GiB', 'TiB'];
  let i = -1;
  do { n /= 1024; i++; } while (n >= 1024 && i < u.length - 1);
  return `${n.toFixed(n < 10 ? 1 : 0)} ${u[i]}`;
}

// stripAnsi drops terminal escape sequences (colours, titles, modes) from a
// pty's output so it reads as text.
function stripAnsi(s) {
  return s
    .replace(/\x1b\][^\x07\x1b]*(\x07|\x1b\\)/g, '') // OSC (window titles)
    .replace(/\x1b\[[0-?]*[ -\/]*[@-~]/g, '') // CSI (colours, cursor, modes)
    .replace(/\x1b[@-Z\\-_]/g, '') // other two-byte escapes
    .replace(/\r\n/g, '\n')
    .replace(/[\x00-\x08\x0b-\x1f\x7f]/g, '');
}

function joinPath(dir, name) {
  return (dir.endsWith('/') ? dir : dir + '/') + name;
}

function parentPath(p) {
  const parts = p.split('/').filter(Boolean);
  parts.pop();
  return '/' + parts.join('/');
}

class HTTPError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorOf(r, what) {
  let msg = '';
  try {
    const text = await r.text();
    try { msg = JSON.parse(text).message || text; } catch { msg = text; }
  } catch { /* no body */ }
  return new HTTPError(r.status, `${what}: ${msg.trim() || 'HTTP ' + r.status}`);
}

// api calls the control-plane REST API with the key.
export async function api(method, path, body) {
  const headers = { 'X-API-Key': key() };
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(BASE + path, init);
  if (r.status === 401) {
    logout('The daemon refused the API key; log in again.');
    throw new HTTPError(401, 'unauthenticated');
  }
  if (!r.ok) throw await errorOf(r, `${method} ${path}`);
  if (r.status === 204) return null;
  const ct = r.headers.get('Content-Type') || '';
  return ct.includes('json') ? r.json() : r.text();
}

// envd calls the sandbox's agent through the daemon's sandbox proxy,
// routed by E2B's headers.
async function envd(sb, path, init = {}) {
  const headers = { 'E2b-Sandbox-Id': sb.sandboxID, 'E2b-Sandbox-Port': ENVD_PORT, ...(init.headers || {}) };
  if (sb.envdAccessToken) headers['X-Access-Token'] = sb.envdAccessToken;
  const r = await fetch(BASE + path, { ...init, headers });
  if (!r.ok) throw await errorOf(r, path.split('?')[0]);
  return r;
}

// rpc is a unary Connect call with the JSON codec.
async function rpc(sb, method, body) {
  const r = await envd(sb, '/' + method, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
    body: JSON.stringify(body),
  });
  return r.json();
}

let flashMsg = null;
export function flash(text, kind = 'info') {
  flashMsg = { text, kind };
  const el = document.getElementById('flash');
  if (el) showFlash(el);
}
function showFlash(el) {
  el.replaceChildren();
  if (!flashMsg) return;
  el.append(h('div', { class: `flash ${flashMsg.kind}`, role: flashMsg.kind === 'error' ? 'alert' : 'status' }, flashMsg.text));
}

function logout(message) {
  sessionStorage.removeItem(KEY_STORAGE);
  flashMsg = message ? { text: message, kind: 'error' } : null;
  if (location.hash !== '#/login') location.hash = '#/login';
  else render();
}

export function every(ms, fn) {
  let stopped = false;
  let timer;
  const tick = async () => {
    try { await fn(); } catch (e) { if (!(e instanceof HTTPError && e.status === 401)) console.warn(e); }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  leaveView.push(() => { stopped = true; clearTimeout(timer); });
}

// The console's pages, in the order of the navigation bar.
const PAGES = [
  ['', 'Sandboxes'], ['templates', 'Templates'], ['snapshots', 'Snapshots'], ['volumes', 'Volumes'],
  ['pools', 'Pools'], ['keys', 'API keys'], ['secrets', 'Secrets'], ['host', 'Host'],
];

function header() {
  const here = (location.hash || '#/').slice(2).split('/')[0];
  const cur = here === 'sandbox' ? '' : here === 'build' ? 'templates' : here;
  return h('header', { class: 'top' },
    h('a', { href: '#/', class: 'brand' }, 'cella'), h('span', { class: 'sub' }, 'console'),
    h('nav', { class: 'nav' }, PAGES.map(([p, label]) => h('a', { href: `#/${p}`, id: `nav-${p || 'sandboxes'}`, class: p === cur ? 'current' : undefined }, label))),
    h('span', { class: 'grow' }),
    h('button', { id: 'logout-btn', class: 'ghost', onclick: () => logout() }, 'Log out'));
}

// page draws a page of the console: the header, the flash, a title and
// the content.
export function page(title, ...content) {
  const fl = h('div', { id: 'flash' });
  showFlash(fl);
  flashMsg = null;
  app.replaceChildren(header(), h('main', {}, fl, h('h2', {}, title), ...content));
}

// A state badge shows text (the state, unless told) in the state's colours;
// stateBadge makes one, setStateBadge changes one in place.
const badgeClass = (state) => `badge state-${state}`;

function stateBadge(state, id) {
  return h('span', { class: badgeClass(state), id }, state);
}

function setStateBadge(el, state, text = state) {
  el.textContent = text;
  el.className = badgeClass(state);
}

// ---------- the audit log ----------

const AUDIT_LIMIT = 500;
const AUDIT_FILTERS = {
  all: { label: 'All', q: {} },
  network: { label: 'Network', q: { kind: 'connect,dns' } },
  commands: { label: 'Commands', q: { kind: 'process.start,process.exit' } },
  files: { label: 'Files', q: { kind: 'file.write,file.mkdir,file.move,file.remove' } },
  blocked: { label: 'Blocked only', q: { decision: 'blocked' } },
};

// fmtClock is an audit entry's time: the time of day, the date too when it
// is not today.
function fmtClock(t) {
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return '—';
  const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
  return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString()} ${time}`;
}

// auditRow is one audit entry as a table row; cmds maps pids to the command
// lines of their process.start entries (process.exit carries only the pid).
function auditRow(e, cmds) {
  const kind = e.kind || '';
  let what = [];
  let result = '';
  if (kind === 'connect' || kind === 'dns') {
    // A lookup's dst is only the resolver's side: the name is what counts.
    const dst = kind === 'connect' ? e.dst : '';
    what = [e.proto && e.proto !== kind ? h('span', { class: 'muted' }, `${e.proto} `) : '', e.host || dst || '',
      e.host && dst ? h('span', { class: 'muted' }, ` → ${dst}`) : ''];
    result = e.decision || '';
  } else if (kind === 'process.start' || kind === 'process.exit') {
    const cmd = kind === 'process.start' ? e.cmd : (e.cmd || cmds.get(e.pid));
    what = [e.pid ? h('span', { class: 'muted' }, `[${e.pid}] `) : '', cmd || ''];
    if (kind === 'process.exit') {
      result = e.exitCode !== undefined && e.exitCode !== null ? `exit ${e.exitCode}` : '';
      if (e.status && !/^exit status \d+$/.test(e.status)) result = result ? `${result} (${e.status})` : e.status;
    }
  } else if (kind.startsWith('file.')) {
    what = [e.path || '', kind === 'file.write' && e.size ? h('span', { class: 'muted' }, ` (${fmtBytes(e.size)})`) : ''];
  } else {
    what = [e.message || e.path || e.cmd || ''];
  }
  if (!result && e.error) result = 'failed';
  const reason = [e.reason, e.rule && `rule: ${e.rule}`, e.error].filter(Boolean).join(' · ');
  const failed = !!e.error || (kind === 'process.exit' && e.exitCode !== undefined && e.exitCode !== 0);
  const cls = e.decision === 'blocked' ? 'blocked' : failed ? 'failed' : '';
  const details = [kind === 'dns' && e.dst && `resolver ${e.dst}`, e.user && `user ${e.user}`, e.cwd && `cwd ${e.cwd}`, e.upstream && `upstream ${e.upstream}`,
    e.bytesOut && `${fmtBytes(e.bytesOut)} out`, e.bytesIn && `${fmtBytes(e.bytesIn)} in`, e.source && `from the ${e.source}`]
    .filter(Boolean).join(', ');
  return h('tr', { class: cls || undefined, dataset: { kind, decision: e.decision || '' } },
    h('td', { class: 'time', title: e.time || '' }, fmtClock(e.time)),
    h('td', { class: 'mono kind' }, kind),
    h('td', { class: 'mono what', title: details || undefined }, what),
    h('td', { class: 'result' }, result),
    h('td', { class: 'reason' }, reason));
}

// ---------- views ----------

function loginView() {
  const err = h('p', { id: 'login-error', class: 'error', role: 'alert' });
  const input = h('input', { id: 'api-key', type: 'password', autocomplete: 'off', spellcheck: 'false', placeholder: 'e2b_…', required: true, oninput: () => { err.textContent = ''; } });
  const form = h('form', {
    id: 'login-form', class: 'card login',
    onsubmit: async (ev) => {
      ev.preventDefault();
      err.textContent = '';
      const k = input.value.trim();
      const r = await fetch(BASE + '/v2/sandboxes', { headers: { 'X-API-Key': k } }).catch((e) => ({ ok: false, status: 0, e }));
      if (!r.ok) {
        err.textContent = r.status === 401 ? 'That key is not valid for this daemon.' : `Could not reach the daemon (${r.status || r.e}).`;
        return;
      }
      sessionStorage.setItem(KEY_STORAGE, k);
      flashMsg = null;
      location.hash = '#/';
    },
  },
  h('h1', {}, 'cella'),
  h('p', { class: 'muted' }, 'Log in with an API key of this daemon (the admin key is in /var/lib/cella/admin.key).'),
  h('label', { for: 'api-key' }, 'API key'), input,
  h('button', { id: 'login-btn', type: 'submit' }, 'Log in'),
  err);
  const fl = h('div', { id: 'flash' });
  showFlash(fl);
  app.replaceChildren(h('main', { class: 'center' }, fl, form));
  input.focus();
}

function listView() {
  const tbody = h('tbody');
  const table = h('table', { id: 'sandboxes', class: 'list' },
    h('thead', {}, h('tr', {}, ['Sandbox', 'State', 'Template', 'Age', 'CPU', 'Memory', ''].map((t) => h('th', {}, t)))),
    tbody);
  const empty = h('p', { id: 'no-sandboxes', class: 'muted', hidden: true }, 'No sandboxes. Create one above.');
  // The picker: the machine's templates, then the caller's snapshots.
  const tpl = h('select', { id: 'template', required: true }, h('option', { value: '', disabled: true }, 'loading…'));
  const cpus = h('input', { id: 'cpus', type: 'number', min: '0.1', step: '0.1', placeholder: 'default' });
  const mem = h('input', { id: 'memory', type: 'number', min: '16', step: '16', placeholder: 'default' });
  const timeout = h('input', { id: 'timeout', type: 'number', min: '1', value: '15' });
  const createBtn = h('button', { id: 'create-btn', type: 'submit' }, 'Create sandbox');
  const form = h('form', {
    id: 'create-form', class: 'card row',
    onsubmit: async (ev) => {
      ev.preventDefault();
      createBtn.disabled = true;
      createBtn.textContent = 'Creating…';
      try {
        const body = { templateID: tpl.value, timeout: Math.round(Number(timeout.value) * 60) };
        if (cpus.value) body.cpuCount = Number(cpus.value);
        if (mem.value) body.memoryMB = Number(mem.value);
        const sb = await api('POST', '/v2/sandboxes', body);
        flash(`Created sandbox ${sb.sandboxID}.`);
        await refresh();
      } catch (e) {
        flash(e.message, 'error');
      } finally {
        createBtn.disabled = false;
        createBtn.textContent = 'Create sandbox';
      }
    },
  },
  h('label', {}, 'Template ', tpl),
  h('label', {}, 'CPUs ', cpus),
  h('label', {}, 'Memory (MiB) ', mem),
  h('label', {}, 'Timeout (min) ', timeout),
  createBtn);

  async function refresh() {
    const list = await api('GET', '/v2/sandboxes?limit=100');
    list.sort((a, b) => (b.startedAt || '').localeCompare(a.startedAt || ''));
    const now = Date.now();
    tbody.replaceChildren(...list.map((sb) => h('tr', { dataset: { id: sb.sandboxID, state: sb.state } },
      h('td', {}, h('a', { href: `#/sandbox/${sb.sandboxID}`, class: 'mono' }, sb.sandboxID)),
      h('td', { class: 'state' }, stateBadge(sb.state)),
      h('td', { class: 'template' }, sb.templateID),
      h('td', { class: 'age' }, fmtAge(now - Date.parse(sb.startedAt))),
      h('td', { class: 'cpu' }, String(sb.cpuCount)),
      h('td', { class: 'memory' }, `${sb.memoryMB} MiB`),
      h('td', {}, h('a', { href: `#/sandbox/${sb.sandboxID}`, class: 'button small' }, 'Open')))));
    empty.hidden = list.length > 0;
    table.hidden = list.length === 0;
  }

  const fl = h('div', { id: 'flash' });
  showFlash(fl);
  app.replaceChildren(header(), h('main', {}, fl,
    h('h2', {}, 'New sandbox'), form,
    h('h2', {}, 'Sandboxes'), table, empty));
  flashMsg = null;
  Promise.all([api('GET', '/templates'), api('GET', '/snapshots?limit=100').catch(() => [])]).then(([ts, sns]) => {
    const want = new URLSearchParams(location.hash.split('?')[1] || '').get('template') || 'base';
    tpl.replaceChildren(
      h('optgroup', { label: 'Templates' }, ts.map((t) => h('option', { value: t.templateID }, t.templateID))),
      sns.length ? h('optgroup', { label: 'Snapshots' }, sns.map((sn) => h('option', { value: sn.snapshotID }, `${(sn.names || [])[0] || sn.snapshotID} (of ${sn.sandboxID})`))) : null);
    tpl.value = [...tpl.options].some((o) => o.value === want) ? want : (ts[0] ? ts[0].templateID : '');
    tpl.dataset.loaded = String(ts.length);
  }).catch((e) => flash(`Templates: ${e.message}`, 'error'));
  every(REFRESH_MS, refresh);
}

function sandboxView(id) {
  let sb = null; // the latest GET /sandboxes/{id}
  let term = null;
  const fl = h('div', { id: 'flash' });
  const stateEl = h('span', { id: 'sandbox-state', class: 'badge' }, '…');
  const facts = h('dl', { id: 'facts', class: 'facts' });
  const pauseBtn = h('button', { id: 'pause-btn', disabled: true }, 'Pause');
  const resumeBtn = h('button', { id: 'resume-btn', disabled: true }, 'Resume');
  const killBtn = h('button', { id: 'kill-btn', class: 'danger', disabled: true }, 'Kill');
  const snapBtn = h('button', { id: 'snapshot-btn', disabled: true }, 'Snapshot');
  const termEl = h('div', { id: 'terminal' });
  const termStatus = h('span', { id: 'term-status', class: 'muted' }, 'not connected');
  const newShellBtn = h('button', { id: 'new-shell-btn', class: 'small', hidden: true }, 'New shell');
  // A desktop sandbox's live view goes beside the terminal (desktop.js).
  const termRow = h('div', { id: 'term-row' });
  let desktop = null;

  const actions = async (label, fn) => {
    for (const b of [pauseBtn, resumeBtn, killBtn, snapBtn]) b.disabled = true;
    flash(`${label}…`);
    try {
      const msg = await fn();
      flash(msg || `${label}: done.`);
    } catch (e) {
      flash(`${label}: ${e.message}`, 'error');
    }
    await load().catch(() => {});
  };
  pauseBtn.onclick = () => actions('Pause', () => api('POST', `/sandboxes/${id}/pause`, {}));
  resumeBtn.onclick = () => actions('Resume', () => api('POST', `/v2/sandboxes/${id}/connect`, {}));
  snapBtn.onclick = () => actions('Snapshot', async () => {
    const sn = await api('POST', `/sandboxes/${id}/snapshots`, {});
    return `Snapshot ${sn.snapshotID} taken (${fmtBytes(sn.sizeBytes)}); start sandboxes from it on the Snapshots page.`;
  });
  // killed stops the page's polling once a kill is asked for: the sandbox
  // is about to be gone, and its routes would answer 404 until the page is
  // left.
  let killed = false;
  killBtn.onclick = async () => {
    if (!confirm(`Kill sandbox ${id}? Its processes and files are gone for good.`)) return;
    killed = true;
    try {
      await api('DELETE', `/sandboxes/${id}`);
      flash(`Killed sandbox ${id}.`);
      location.hash = '#/';
    } catch (e) {
      killed = false;
      flash(`Kill: ${e.message}`, 'error');
    }
  };

  // ----- files -----
  let cwd = '/home/user';
  const pathInput = h('input', { id: 'file-path', class: 'mono', value: cwd });
  const filesBody = h('tbody');
  const filesStatus = h('p', { id: 'files-status', class: 'muted' });
  const upload = h('input', { id: 'upload', type: 'file', multiple: true });
  const filesTable = h('table', { id: 'files', class: 'list' },
    h('thead', {}, h('tr', {}, ['Name', 'Size', 'Permissions', 'Modified', ''].map((t) => h('th', {}, t)))), filesBody);

  async function listDir(path) {
    if (!sb || sb.state !== 'running') {
      filesStatus.textContent = 'The file browser needs a running sandbox.';
      return;
    }
    filesStatus.textContent = 'Loading…';
    try {
      const r = await rpc(sb, 'filesystem.Filesystem/ListDir', { path, depth: 1 });
      cwd = path;
      pathInput.value = path;
      const entries = (r.entries || []).filter((e) => e.type && e.type !== 'FILE_TYPE_UNSPECIFIED');
      entries.sort((a, b) => ((a.type === 'FILE_TYPE_DIRECTORY') === (b.type === 'FILE_TYPE_DIRECTORY') ? a.name.localeCompare(b.name) : a.type === 'FILE_TYPE_DIRECTORY' ? -1 : 1));
      const rows = [];
      if (path !== '/') {
        rows.push(h('tr', { class: 'dir' }, h('td', {}, h('button', { class: 'link', onclick: () => listDir(parentPath(path)) }, '../')), h('td'), h('td'), h('td'), h('td')));
      }
      for (const e of entries) {
        const isDir = e.type === 'FILE_TYPE_DIRECTORY';
        rows.push(h('tr', { dataset: { name: e.name, type: isDir ? 'dir' : 'file' }, class: isDir ? 'dir' : 'file' },
          h('td', {}, isDir
            ? h('button', { class: 'link', onclick: () => listDir(e.path) }, `${e.name}/`)
            : h('span', {}, e.name)),
          h('td', {}, isDir ? '' : fmtBytes(e.size)),
          h('td', { class: 'mono' }, e.permissions || ''),
          h('td', {}, fmtTime(e.modifiedTime)),
          h('td', {}, isDir ? '' : h('button', { class: 'small download', onclick: () => download(e) }, 'Download'))));
      }
      filesBody.replaceChildren(...rows);
      filesStatus.textContent = `${entries.length} entr${entries.length === 1 ? 'y' : 'ies'} in ${path}`;
    } catch (e) {
      filesStatus.textContent = e.message;
    }
  }

  async function download(e) {
    try {
      const r = await envd(sb, '/files?' + new URLSearchParams({ path: e.path }));
      const url = URL.createObjectURL(await r.blob());
      const a = h('a', { href: url, download: e.name, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (err) {
      flash(`Download: ${err.message}`, 'error');
    }
  }

  upload.addEventListener('change', async () => {
    const files = [...upload.files];
    if (!files.length) return;
    try {
      for (const f of files) {
        const dest = joinPath(cwd, f.name);
        filesStatus.textContent = `Uploading ${f.name}…`;
        const fd = new FormData();
        fd.append('file', f, dest);
        await envd(sb, '/files?' + new URLSearchParams({ path: dest }), { method: 'POST', body: fd });
      }
      flash(`Uploaded ${files.map((f) => f.name).join(', ')} to ${cwd}.`);
    } catch (e) {
      flash(`Upload: ${e.message}`, 'error');
    }
    upload.value = '';
    await listDir(cwd);
  });

  // ----- activity -----
  const lifecycle = h('ul', { id: 'lifecycle', class: 'events' });
  const procBody = h('tbody');
  const procStatus = h('p', { id: 'processes-status', class: 'muted' });
  const logTitle = h('h4', { hidden: true });
  const logPre = h('pre', { id: 'process-log', class: 'log', hidden: true });
  const procTable = h('table', { id: 'processes', class: 'list' },
    h('thead', {}, h('tr', {}, ['PID', 'Command', 'Tag', ''].map((t) => h('th', {}, t)))), procBody);

  function renderLifecycle() {
    const ev = [];
    const d = sb;
    const add = (t, text) => ev.push({ t, text });
    add(d.startedAt, `started from template ${d.templateID} (${d.runtime || 'runtime ?'}, ${d.cpuCount} CPU, ${d.memoryMB} MiB)`);
    const lc = d.lifecycle || {};
    if (lc.lastActivityAt && !lc.lastActivityAt.startsWith('0001-')) add(lc.lastActivityAt, 'last activity');
    if (lc.pausedAt) add(lc.pausedAt, `paused${d.pauseMode ? ` (${d.pauseMode})` : ''}`);
    if (lc.archived) add(null, `archived${lc.archivePath ? ' to ' + lc.archivePath : ''}`);
    if (d.error) add(null, `error: ${d.error}`);
    if (d.nextTransition) add(d.nextTransition.at, `next: ${d.nextTransition.action}${d.nextTransition.reason ? ' — ' + d.nextTransition.reason : ''} (scheduled)`);
    else if (d.state === 'running' && d.endAt) add(d.endAt, `timeout: ${lc.onTimeout || 'kill'} (scheduled)`);
    ev.sort((a, b) => (a.t || '9').localeCompare(b.t || '9'));
    lifecycle.replaceChildren(...ev.map((e) => h('li', {}, h('time', {}, e.t ? fmtTime(e.t) : ''), ' ', e.text)));
  }

  async function loadProcesses() {
    if (!sb || sb.state !== 'running') {
      procStatus.textContent = 'The process list needs a running sandbox.';
      procBody.replaceChildren();
      return;
    }
    try {
      const r = await rpc(sb, 'process.Process/List', {});
      const ps = (r.processes || []).sort((a, b) => a.pid - b.pid);
      procBody.replaceChildren(...ps.map((p) => h('tr', { dataset: { pid: p.pid } },
        h('td', { class: 'mono' }, String(p.pid)),
        h('td', { class: 'mono cmd' }, [p.config?.cmd, ...(p.config?.args || [])].filter(Boolean).join(' ')),
        h('td', {}, p.tag || ''),
        h('td', {}, h('button', { class: 'small', onclick: () => showLogs(p.pid) }, 'Logs')))));
      procStatus.textContent = `${ps.length} process${ps.length === 1 ? '' : 'es'} started through the agent (commands, shells).`;
    } catch (e) {
      procStatus.textContent = e.message;
    }
  }

  async function showLogs(pid) {
    logTitle.hidden = false;
    logPre.hidden = false;
    logTitle.textContent = `Output of process ${pid}`;
    try {
      const text = await api('GET', `/sandboxes/${id}/processes/${pid}/logs?format=text`);
      logPre.textContent = typeof text === 'string' ? stripAnsi(text) : JSON.stringify(text, null, 2);
    } catch (e) {
      logPre.textContent = e.message;
    }
  }

  // ----- audit log -----
  // GET /sandboxes/{id}/logs: the daemon's per-sandbox record of what the
  // sandbox did (egress proxy: connect/dns with allowed/blocked; agent:
  // processes started and ended, files written through the API; lifecycle).
  const auditFilter = h('select', { id: 'audit-filter', 'aria-label': 'Show' },
    Object.entries(AUDIT_FILTERS).map(([v, f]) => h('option', { value: v }, f.label)));
  const auditBody = h('tbody');
  const auditTable = h('table', { id: 'audit', class: 'list' },
    h('thead', {}, h('tr', {}, ['Time', 'Kind', 'What', 'Result', 'Reason'].map((t) => h('th', {}, t)))), auditBody);
  const auditScroll = h('div', { class: 'audit-scroll' }, auditTable);
  const auditStatus = h('p', { id: 'audit-status', class: 'muted' }, 'Loading…');
  const auditCmds = new Map(); // pid → command line, from the process.start entries seen
  let auditSig = null; // what the table shows, to leave it alone when nothing changed
  let auditReq = 0;

  async function loadAudit() {
    if (killed) return;
    const req = ++auditReq;
    const filter = AUDIT_FILTERS[auditFilter.value] || AUDIT_FILTERS.all;
    const q = new URLSearchParams({ limit: String(AUDIT_LIMIT), ...filter.q });
    let r;
    try {
      r = await api('GET', `/sandboxes/${encodeURIComponent(id)}/logs?${q}`);
    } catch (e) {
      if (req !== auditReq) return;
      auditStatus.textContent = e.status === 404 ? 'No audit log: the sandbox is gone.'
        : e.status === 501 ? 'This daemon keeps no audit log.' : e.message;
      auditStatus.className = e.status === 404 || e.status === 501 ? 'muted' : 'error';
      return;
    }
    if (req !== auditReq) return; // a newer load (filter change, Refresh) is under way
    const entries = (r && r.entries) || [];
    for (const e of entries) if (e.kind === 'process.start' && e.pid) auditCmds.set(e.pid, e.cmd || '');
    const blocked = entries.filter((e) => e.decision === 'blocked').length;
    auditStatus.className = 'muted';
    auditStatus.textContent = entries.length === 0
      ? (auditFilter.value === 'all' ? 'Nothing recorded yet.' : 'No entries match this filter.')
      : `${entries.length === AUDIT_LIMIT ? `The newest ${AUDIT_LIMIT}` : entries.length} entr${entries.length === 1 ? 'y' : 'ies'}, newest last`
        + (blocked ? `; ${blocked} blocked` : '') + '.';
    const sig = auditFilter.value + '\n' + JSON.stringify(entries);
    if (sig === auditSig) return;
    const first = auditSig === null || !auditSig.startsWith(auditFilter.value + '\n');
    auditSig = sig;
    // Keep following the newest entries unless the user scrolled up.
    const atBottom = auditScroll.scrollTop + auditScroll.clientHeight >= auditScroll.scrollHeight - 24;
    auditBody.replaceChildren(...entries.map((e) => auditRow(e, auditCmds)));
    auditTable.hidden = entries.length === 0;
    if (first || atBottom) auditScroll.scrollTop = auditScroll.scrollHeight;
  }
  auditFilter.addEventListener('change', () => { auditSig = null; auditBody.replaceChildren(); auditStatus.textContent = 'Loading…'; loadAudit(); });

  // ----- terminal -----
  function startTerminal() {
    const t = new Terminal({
      cursorBlink: true, fontSize: 14, scrollback: 5000,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      theme: { background: '#11151c', foreground: '#d8dee9' },
    });
    const fit = new FitAddon();
    t.loadAddon(fit);
    t.open(termEl);
    try { fit.fit(); } catch { /* not laid out yet */ }
    window.cellaTerm = t; // for tests and debugging
    const enc = new TextEncoder();
    let ws = null;
    let session = null;
    let offset = 0;
    let ended = false;
    let closed = false;
    let retries = 0;
    let timer = null;
    const send = (data) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(data); };
    t.onData((d) => send(enc.encode(d)));
    t.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 255)));
    t.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })));
    const onWinResize = () => { try { fit.fit(); } catch { /* hidden */ } };
    window.addEventListener('resize', onWinResize);
    const status = (s, cls = 'muted') => { termStatus.textContent = s; termStatus.className = cls; };

    function connect() {
      clearTimeout(timer);
      if (closed) return;
      const q = new URLSearchParams({ cols: t.cols, rows: t.rows });
      if (session) { q.set('session', session); q.set('offset', offset); }
      const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
      const sock = new WebSocket(`${scheme}//${location.host}${BASE}/sandboxes/${encodeURIComponent(id)}/pty?${q}`, ['cella.pty', `cella-key.${key()}`]);
      ws = sock;
      sock.binaryType = 'arraybuffer';
      let opened = false;
      status(session ? 'reconnecting…' : 'connecting…');
      sock.onopen = () => { opened = true; retries = 0; status('connected', 'ok'); t.focus(); };
      sock.onmessage = (ev) => {
        if (typeof ev.data === 'string') {
          let m;
          try { m = JSON.parse(ev.data); } catch { return; }
          if (m.type === 'session') {
            session = m.session;
            offset = m.offset;
          } else if (m.type === 'exit') {
            ended = true;
            status(`shell ended: ${m.status || 'exit ' + m.exitCode}`);
            newShellBtn.hidden = false;
          } else if (m.type === 'error') {
            t.write(`\r\n\x1b[31m[cella] ${m.message}\x1b[0m\r\n`);
          }
          return;
        }
        const b = new Uint8Array(ev.data);
        offset += b.length;
        t.write(b);
      };
      sock.onclose = () => {
        if (ws !== sock || closed || ended) return;
        // A re-attach that never opened: the session is gone, start anew.
        if (!opened && session) { session = null; offset = 0; }
        if (sb && sb.state !== 'running') { status(`disconnected: the sandbox is ${sb.state}`); return; }
        retries++;
        if (retries > 6) { status('disconnected', 'error'); newShellBtn.hidden = false; return; }
        status('reconnecting…');
        timer = setTimeout(connect, Math.min(5000, 400 * 2 ** retries));
      };
    }
    connect();
    newShellBtn.onclick = () => {
      newShellBtn.hidden = true;
      ended = false; session = null; offset = 0; retries = 0;
      if (ws) { const old = ws; ws = null; old.close(); }
      t.reset();
      connect();
    };
    return {
      term: t,
      // ensure re-attaches (or starts a shell) after a pause or a dropped link.
      ensure() {
        if (closed || ended) return;
        if (!ws || ws.readyState === WebSocket.CLOSED || ws.readyState === WebSocket.CLOSING) { retries = 0; connect(); } else if (ws.readyState === WebSocket.OPEN) status('connected', 'ok');
      },
      dispose() {
        closed = true;
        clearTimeout(timer);
        window.removeEventListener('resize', onWinResize);
        if (ws) ws.close();
        t.dispose();
        if (window.cellaTerm === t) delete window.cellaTerm;
      },
    };
  }

  // ----- resources -----
  // GET /sandboxes/{id}/metrics: the daemon's samples of the last hour (and
  // one of the present, taken when the newest is over a second old).
  const cpuChart = chartSVG('chart-cpu', 'CPU use, percent of the sandbox\'s CPUs');
  const memChart = chartSVG('chart-memory', 'memory used and its ceiling');
  const diskChart = chartSVG('chart-disk', 'disk used and the writable layer\'s size');
  const resStatus = h('span', { id: 'resources-status', class: 'muted' });
  const mib = (n) => fmtBytes(n);
  async function loadResources() {
    if (killed) return;
    if (!sb) return;
    const start = Math.floor(Date.now() / 1000) - 3600;
    const ms = await api('GET', `/sandboxes/${encodeURIComponent(id)}/metrics?start=${start}`);
    const pts = (f) => ms.map((m) => [m.timestampUnix, f(m)]);
    // The x axis covers the samples (at least 30 s, at most the hour).
    const span = ms.length ? Math.min(3600, Math.max(30, ms[ms.length - 1].timestampUnix - ms[0].timestampUnix)) : 3600;
    lineChart(cpuChart, [{ name: 'cpu', cls: 'cpu', points: pts((m) => m.cpuUsedPct) }], { max: 100, fmt: (v) => `${Math.round(v)}%`, span });
    const memMax = Math.max(...ms.map((m) => m.memTotal), 1);
    lineChart(memChart, [{ name: 'used', cls: 'used', points: pts((m) => m.memUsed) }, { name: 'cache', cls: 'cache', points: pts((m) => m.memCache) }],
      { max: memMax, fmt: mib, span });
    const diskMax = Math.max(...ms.map((m) => m.diskTotal), 1);
    lineChart(diskChart, [{ name: 'used', cls: 'used', points: pts((m) => m.diskUsed) }], { max: diskMax, fmt: mib, span });
    const last = ms[ms.length - 1];
    resStatus.textContent = last
      ? `${ms.length} samples; now ${last.cpuUsedPct.toFixed(1)}% CPU, ${fmtBytes(last.memUsed)} of ${fmtBytes(last.memTotal)} memory, ${fmtBytes(last.diskUsed)} of ${fmtBytes(last.diskTotal)} disk`
      : 'no samples yet';
  }

  // ----- the sandbox record -----
  let lastState = null;
  async function load() {
    if (killed) return;
    try {
      sb = await api('GET', `/sandboxes/${id}`);
    } catch (e) {
      if (e.status === 404) {
        sb = null;
        setStateBadge(stateEl, 'dead', 'gone');
        flash(`Sandbox ${id} does not exist (any more).`, 'error');
        for (const b of [pauseBtn, resumeBtn, killBtn, snapBtn]) b.disabled = true;
        return;
      }
      throw e;
    }
    setStateBadge(stateEl, sb.state);
    pauseBtn.disabled = sb.state !== 'running';
    snapBtn.disabled = sb.state !== 'running';
    resumeBtn.disabled = sb.state !== 'paused';
    killBtn.disabled = false;
    const f = [
      ['Template', sb.templateID], ['Runtime', sb.runtime], ['CPU', String(sb.cpuCount)], ['Memory', `${sb.memoryMB} MiB`],
      ['Disk', sb.diskSizeMB ? `${fmtBytes(sb.diskUsedBytes)} of ${sb.diskSizeMB} MiB` : fmtBytes(sb.diskUsedBytes)],
      ['Age', fmtAge(Date.now() - Date.parse(sb.startedAt))], ['Started', fmtTime(sb.startedAt)],
      ['Ends', sb.state === 'running' ? fmtTime(sb.endAt) : '—'],
    ];
    facts.replaceChildren(...f.flatMap(([k, v]) => [h('dt', {}, k), h('dd', { dataset: { fact: k.toLowerCase() } }, v || '—')]));
    renderLifecycle();
    if (!desktop && isDesktop(sb)) {
      desktop = desktopPanel(id, { h, envd, base: BASE });
      termRow.className = 'cols';
      termRow.append(desktop.el);
    }
    if (desktop) desktop.update(sb);
    if (sb.state !== lastState) {
      const was = lastState;
      lastState = sb.state;
      if (sb.state === 'running') {
        if (!term) term = startTerminal();
        else term.ensure();
        listDir(cwd);
        loadProcesses();
      } else {
        termStatus.textContent = `the sandbox is ${sb.state}${sb.state === 'paused' ? ': resume it to use the terminal' : ''}`;
        termStatus.className = 'muted';
        if (was === 'running') { listDir(cwd); loadProcesses(); }
      }
    }
  }

  app.replaceChildren(header(), h('main', {}, fl,
    h('div', { class: 'title' },
      h('a', { href: '#/', class: 'muted' }, '← Sandboxes'),
      h('h2', {}, h('span', { class: 'mono', id: 'sandbox-id' }, id), ' ', stateEl),
      h('span', { class: 'grow' }), snapBtn, pauseBtn, resumeBtn, killBtn),
    facts,
    h('section', { class: 'card', id: 'resources' },
      h('div', { class: 'section-head' }, h('h3', {}, 'Resources (last hour)'), resStatus),
      h('div', { class: 'charts' },
        h('figure', {}, h('figcaption', {}, 'CPU'), cpuChart),
        h('figure', {}, h('figcaption', {}, 'Memory'), memChart),
        h('figure', {}, h('figcaption', {}, 'Disk'), diskChart))),
    termRow,
    h('div', { class: 'cols' },
      h('section', { class: 'card', id: 'file-browser' },
        h('div', { class: 'section-head' }, h('h3', {}, 'Files')),
        h('form', { class: 'row', onsubmit: (ev) => { ev.preventDefault(); listDir(pathInput.value.trim() || '/'); } },
          pathInput, h('button', { type: 'submit', class: 'small' }, 'Go'),
          h('button', { type: 'button', class: 'small', id: 'files-refresh', onclick: () => listDir(cwd) }, 'Refresh'),
          h('label', { class: 'button small', for: 'upload' }, 'Upload…'), upload),
        filesTable, filesStatus),
      h('section', { class: 'card', id: 'activity' },
        h('div', { class: 'section-head' }, h('h3', {}, 'Activity'), h('span', { class: 'grow' }),
          h('button', { class: 'small', id: 'activity-refresh', onclick: () => { load(); loadProcesses(); } }, 'Refresh')),
        h('p', { class: 'muted note' }, 'The sandbox\'s lifecycle record and the output of the processes started in it. '
          + 'Every connection, command and file write is in the audit log below.'),
        h('h4', {}, 'Lifecycle'), lifecycle,
        h('h4', {}, 'Processes'), procTable, procStatus, logTitle, logPre),
      h('section', { class: 'card wide', id: 'audit-log' },
        h('div', { class: 'section-head' }, h('h3', {}, 'Audit log'), h('span', { class: 'grow' }),
          h('label', { class: 'muted small-label', for: 'audit-filter' }, 'Show'), auditFilter,
          h('button', { class: 'small', id: 'audit-refresh', onclick: () => loadAudit() }, 'Refresh')),
        h('p', { class: 'muted note' }, 'What the sandbox did, as the daemon recorded it: outbound connections and DNS lookups '
          + '(allowed or blocked by the egress policy), every command started through the agent and how it ended, '
          + 'files written, moved and removed through the API, and lifecycle changes.'),
        auditScroll, auditStatus))));
  termRow.append(h('section', { class: 'card' },
    h('div', { class: 'section-head' }, h('h3', {}, 'Terminal'), termStatus, h('span', { class: 'grow' }), newShellBtn),
    termEl));
  showFlash(fl);
  flashMsg = null;
  leaveView.push(() => { if (term) term.dispose(); if (desktop) desktop.close(); });
  every(REFRESH_MS, load);
  every(REFRESH_MS, loadAudit);
  every(REFRESH_MS, loadResources);
}

// ---------- routing ----------

const PAGE_VIEWS = {
  templates: templatesView, snapshots: snapshotsView, volumes: volumesView, pools: poolsView,
  keys: keysView, secrets: secretsView, host: hostView,
};

function render() {
  for (const f of leaveView.splice(0)) f();
  const hash = location.hash || '#/';
  if (!key()) {
    if (hash !== '#/login') { location.hash = '#/login'; return; }
    loginView();
    return;
  }
  const m = hash.match(/^#\/sandbox\/([a-z0-9]+)$/);
  const view = PAGE_VIEWS[hash.slice(2).split('?')[0]];
  const b = hash.match(/^#\/build\/([^/]+)\/([^/]+)$/);
  if (m) sandboxView(m[1]);
  else if (b) buildView(decodeURIComponent(b[1]), decodeURIComponent(b[2]));
  else if (view) view();
  else if (hash === '#/login') { location.hash = '#/'; }
  else listView();
}

window.addEventListener('hashchange', render);
render();
