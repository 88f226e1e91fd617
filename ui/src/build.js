// Template builds from the console, over E2B's build API (the shapes of
// e2b's Template.build): POST /v3/templates makes the template and a waiting
// build, POST /v2/templates/{id}/builds/{buildID} starts it with its steps,
// and GET /templates/{id}/builds/{buildID}/status?logsOffset= pages its log
// until the build is ready or failed. The steps are written as a Dockerfile
// and turned into E2B's steps here, as the SDK's fromDockerfile does.
import { h, api, flash, every, page } from './app.js';

// parseDockerfile turns Dockerfile text into E2B's build start body
// (fromImage or fromTemplate, steps, startCmd); templates are the names a
// FROM may mean as a template of this daemon. COPY needs the SDK's file
// upload, which a browser form has no files for: it is refused by line.
export function parseDockerfile(text, templates) {
  const body = { steps: [] };
  const lines = text.replace(/\\\n/g, ' ').split('\n');
  lines.forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith('#')) return;
    const m = line.match(/^(\w+)\s*(.*)$/);
    const kw = m[1].toUpperCase();
    const rest = m[2].trim();
    const where = `line ${i + 1}`;
    const json = () => { try { const a = JSON.parse(rest); return Array.isArray(a) ? a.join(' ') : null; } catch { return null; } };
    switch (kw) {
      case 'FROM': {
        const img = rest.split(/\s+/)[0];
        if (templates.includes(img)) { body.fromTemplate = img; delete body.fromImage; } else { body.fromImage = img; delete body.fromTemplate; }
        break;
      }
      case 'RUN': body.steps.push({ type: 'RUN', args: [json() ?? rest], force: false }); break;
      case 'ENV': case 'ARG': {
        const args = [];
        if (/^[^=\s]+\s/.test(rest) && !rest.split(/\s+/)[0].includes('=')) {
          const [k, ...v] = rest.split(/\s+/);
          args.push(k, v.join(' '));
        } else {
          for (const kv of rest.match(/[^\s=]+=("[^"]*"|'[^']*'|\S*)/g) || []) {
            const j = kv.indexOf('=');
            args.push(kv.slice(0, j), kv.slice(j + 1).replace(/^["']|["']$/g, ''));
          }
          if (kw === 'ARG' && args.length === 0 && rest) args.push(rest, '');
        }
        if (args.length === 0) throw new Error(`${where}: ${kw} needs NAME=value`);
        body.steps.push({ type: 'ENV', args, force: false });
        break;
      }
      case 'WORKDIR': case 'USER': body.steps.push({ type: kw, args: [rest], force: false }); break;
      case 'CMD': case 'ENTRYPOINT': body.startCmd = json() ?? rest; break;
      case 'EXPOSE': case 'LABEL': case 'MAINTAINER': case 'SHELL': case 'STOPSIGNAL': case 'HEALTHCHECK': case 'VOLUME': break;
      case 'COPY': case 'ADD':
        throw new Error(`${where}: ${kw} needs files uploaded with the build; use the E2B SDK's Template.build or cella template build for that`);
      default: throw new Error(`${where}: unknown instruction ${kw}`);
    }
  });
  if (!body.fromImage && !body.fromTemplate) throw new Error('no FROM: name an image (FROM python:3.12-slim) or a template (FROM base)');
  return body;
}

// buildForm is the templates page's "Build a template" card.
export function buildForm() {
  const name = h('input', { id: 'build-name', required: true, placeholder: 'my-app:v1' });
  const file = h('textarea', { id: 'build-dockerfile', rows: '7', spellcheck: 'false', class: 'mono' },
    'FROM base\nRUN echo hello > /home/user/hello.txt\nENV APP_ENV=prod\nWORKDIR /home/user');
  const ready = h('input', { id: 'build-ready', placeholder: 'ready command (optional)' });
  const btn = h('button', { id: 'build-btn', type: 'submit' }, 'Build');
  const err = h('p', { id: 'build-error', class: 'error', role: 'alert' });
  return h('form', {
    id: 'build-form', class: 'card build-form',
    onsubmit: async (ev) => {
      ev.preventDefault();
      err.textContent = '';
      let start;
      try {
        // What FROM may name as a template: asked now, not from a list
        // that may not have loaded yet.
        const ts = await api('GET', '/templates');
        start = parseDockerfile(file.value, ts.flatMap((t) => [t.templateID, ...(t.aliases || [])]));
      } catch (e) {
        err.textContent = e.message;
        return;
      }
      if (ready.value.trim()) start.readyCmd = ready.value.trim();
      btn.disabled = true;
      try {
        const t = await api('POST', '/v3/templates', { name: name.value.trim() });
        await api('POST', `/v2/templates/${encodeURIComponent(t.templateID)}/builds/${encodeURIComponent(t.buildID)}`, start);
        flash(`Building ${name.value.trim()} (template ${t.templateID}, build ${t.buildID}).`);
        location.hash = `#/build/${t.templateID}/${t.buildID}`;
      } catch (e) {
        err.textContent = e.message;
      } finally {
        btn.disabled = false;
      }
    },
  },
  h('h3', {}, 'Build a template'),
  h('p', { class: 'muted note' }, 'A Dockerfile: FROM an image or one of the templates above, then RUN, ENV, ARG, WORKDIR, USER and CMD '
    + '(the start command). Each step runs in a sandbox; the log shows each step\'s output, and a failing step is marked.'),
  h('div', { class: 'row' }, h('label', {}, 'Name ', name), h('label', { class: 'grow' }, 'Ready command ', ready)),
  file, h('div', { class: 'row' }, btn, err));
}

const STEP_RE = /^\[(base|finalize|builder (\d+)\/\d+)\]/;

// buildView is #/build/{templateID}/{buildID}: the build's status and its
// log, live, a step list with the failing step marked.
export function buildView(tid, bid) {
  const stateEl = h('span', { id: 'build-state', class: 'badge' }, '…');
  const steps = h('ol', { id: 'build-steps', class: 'steps' });
  const body = h('tbody');
  const logTable = h('table', { id: 'build-log', class: 'list log-table' },
    h('thead', {}, h('tr', {}, ['Time', 'Step', 'Message'].map((t) => h('th', {}, t)))), body);
  const scroll = h('div', { class: 'audit-scroll' }, logTable);
  const reason = h('p', { id: 'build-reason', class: 'error', hidden: true });
  page(h('span', {}, 'Build ', h('span', { class: 'mono' }, bid), ' ', stateEl),
    h('p', { class: 'muted' }, h('a', { href: '#/templates' }, '← Templates'), ` · template ${tid}`),
    reason,
    h('div', { class: 'cols' },
      h('section', { class: 'card' }, h('h3', {}, 'Steps'), steps),
      h('section', { class: 'card' }, h('h3', {}, 'Log'), scroll)));
  let offset = 0;
  let done = false;
  const seen = new Map(); // step → its first log line, in order
  every(1000, async () => {
    if (done) return;
    const st = await api('GET', `/templates/${encodeURIComponent(tid)}/builds/${encodeURIComponent(bid)}/status?logsOffset=${offset}`);
    const entries = st.logEntries || [];
    offset += entries.length;
    const atBottom = scroll.scrollTop + scroll.clientHeight >= scroll.scrollHeight - 24;
    for (const e of entries) {
      if (e.step && !seen.has(e.step)) {
        const cached = /^CACHED\s+/.test(e.message);
        const text = e.message.replace(/^CACHED\s+/, '').replace(STEP_RE, '').replace(/\s*\[[0-9a-f…]+\]$/, '').trim();
        seen.set(e.step, cached ? `${text} (cached)` : text);
      }
      body.append(h('tr', { class: e.level === 'error' ? 'failed' : undefined, dataset: { step: e.step || '', level: e.level } },
        h('td', { class: 'time' }, new Date(e.timestamp).toLocaleTimeString([], { hour12: false })),
        h('td', { class: 'mono' }, e.step || ''),
        h('td', { class: 'mono msg' }, e.message)));
    }
    if (atBottom) scroll.scrollTop = scroll.scrollHeight;
    const failing = st.status === 'error' && st.reason ? st.reason.step || '' : '';
    steps.replaceChildren(...[...seen].map(([step, text]) => h('li', { dataset: { step }, class: step === failing ? 'failing' : undefined },
      h('span', { class: 'mono' }, step === 'base' || step === 'finalize' ? step : `step ${step}`), ' ', text)));
    if (failing) for (const tr of body.querySelectorAll(`tr[data-step="${CSS.escape(failing)}"]`)) tr.classList.add('failing');
    stateEl.textContent = st.status;
    stateEl.className = `badge build-${st.status}`;
    if (st.status === 'error' && st.reason) {
      reason.hidden = false;
      reason.textContent = `Failed${failing ? ` at ${/^\d+$/.test(failing) ? 'step ' + failing : failing}` : ''}: ${st.reason.message}`;
    }
    // The log is complete once the build ended and a page came back empty.
    if ((st.status === 'ready' || st.status === 'error') && entries.length === 0) done = true;
  });
}
