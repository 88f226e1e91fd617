// The console's resource pages: templates, snapshots, volumes, pools, API
// keys, secrets and the host overview. Each is a function of no arguments
// that draws the page and polls what changes (every()); the API answers a
// key that may not see a page with a 403 naming what only the admin may do,
// shown in the page's status line.
import { h, api, flash, every, page, fmtBytes, fmtTime, REFRESH_MS } from './app.js';
import { barChart, chartSVG, meter } from './charts.js';
import { buildForm } from './build.js';

// status is a page's one-line status: what it shows or why it cannot.
function status(id) {
  const el = h('p', { id, class: 'muted' }, 'Loading…');
  return {
    el,
    set(text) { el.className = 'muted'; el.textContent = text; },
    fail(e) { el.className = 'error'; el.textContent = e.message; },
  };
}

const plural = (n, one, many = one + 's') => `${n} ${n === 1 ? one : many}`;

function table(id, heads, tbody) {
  return h('table', { id, class: 'list' }, h('thead', {}, h('tr', {}, heads.map((t) => h('th', {}, t)))), tbody);
}

// refresher polls load (which fills the page from the API) and reports a
// failure in st; it returns load, for actions to call after they act.
function refresher(st, load) {
  const run = async () => {
    try { await load(); } catch (e) { st.fail(e); }
  };
  every(REFRESH_MS, run);
  return run;
}

// act runs an action from a button: disabled while it runs, its failure
// flashed; then the page reloads.
async function act(btn, label, fn, reload) {
  btn.disabled = true;
  try {
    const msg = await fn();
    if (msg) flash(msg);
  } catch (e) {
    flash(`${label}: ${e.message}`, 'error');
  } finally {
    btn.disabled = false;
  }
  if (reload) await reload();
}

// createFrom starts a sandbox from a template or snapshot and says so.
async function createFrom(templateID) {
  const sb = await api('POST', '/v2/sandboxes', { templateID, timeout: 15 * 60 });
  flash(`Created sandbox ${sb.sandboxID} from ${templateID}.`);
  location.hash = `#/sandbox/${sb.sandboxID}`;
}

// ---------- templates ----------

export function templatesView() {
  const tbody = h('tbody');
  const st = status('templates-status');
  page('Templates',
    h('p', { class: 'muted note' }, 'The templates on this machine (built with cella template on the host), with their warm pools. '
      + 'Start a sandbox from one here or on the Sandboxes page.'),
    table('templates', ['Template', 'Aliases', 'Build', 'Warm pool', ''], tbody), st.el,
    buildForm());
  refresher(st, async () => {
    const [ts, pools] = await Promise.all([api('GET', '/templates'), api('GET', '/pools').catch(() => [])]);
    const pool = new Map(pools.map((p) => [p.template, p]));
    tbody.replaceChildren(...ts.map((t) => {
      const p = pool.get(t.templateID);
      const btn = h('button', { class: 'small create' }, 'Create sandbox');
      btn.onclick = () => act(btn, 'Create', () => createFrom(t.templateID));
      return h('tr', { dataset: { template: t.templateID } },
        h('td', { class: 'mono name' }, t.templateID),
        h('td', {}, (t.aliases || []).filter((a) => a !== t.templateID).join(', ') || '—'),
        h('td', { class: 'build' }, t.buildStatus ? `${t.buildStatus}${t.buildCount ? ` (${plural(t.buildCount, 'build')})` : ''}` : '—'),
        h('td', {}, p ? `${p.ready} ready of ${p.size}` : '—'),
        h('td', {}, btn));
    }));
    st.set(plural(ts.length, 'template') + '.');
  });
}

// ---------- snapshots ----------

export function snapshotsView() {
  const tbody = h('tbody');
  const st = status('snapshots-status');
  page('Snapshots',
    h('p', { class: 'muted note' }, 'Snapshots of sandboxes (take one from a sandbox\'s page). A sandbox made from a snapshot starts '
      + 'with its files and, under gVisor, its memory and processes.'),
    table('snapshots', ['Snapshot', 'Names', 'Of sandbox', 'Template', 'Taken', 'Memory', 'Size', ''], tbody), st.el);
  const load = refresher(st, async () => {
    const list = await api('GET', '/snapshots?limit=100');
    list.sort((a, b) => (b.createdAt || '').localeCompare(a.createdAt || ''));
    tbody.replaceChildren(...list.map((sn) => {
      const create = h('button', { class: 'small create' }, 'Create sandbox');
      create.onclick = () => act(create, 'Create', () => createFrom(sn.snapshotID));
      const del = h('button', { class: 'small danger delete' }, 'Delete');
      del.onclick = () => {
        if (!confirm(`Delete snapshot ${sn.snapshotID}? Sandboxes made from it keep running.`)) return;
        act(del, 'Delete', async () => { await api('DELETE', `/templates/${encodeURIComponent(sn.snapshotID)}`); return `Deleted snapshot ${sn.snapshotID}.`; }, load);
      };
      return h('tr', { dataset: { id: sn.snapshotID } },
        h('td', { class: 'mono' }, sn.snapshotID),
        h('td', {}, (sn.names || []).join(', ') || '—'),
        h('td', { class: 'mono' }, sn.sandboxID),
        h('td', {}, sn.templateID),
        h('td', {}, fmtTime(sn.createdAt)),
        h('td', {}, sn.memory ? 'with memory' : 'files only'),
        h('td', {}, fmtBytes(sn.sizeBytes)),
        h('td', { class: 'actions' }, create, ' ', del));
    }));
    st.set(list.length ? plural(list.length, 'snapshot') + '.' : 'No snapshots yet.');
  });
}

// ---------- volumes ----------

export function volumesView() {
  const tbody = h('tbody');
  const st = status('volumes-status');
  const name = h('input', { id: 'volume-name', required: true, placeholder: 'name' });
  const size = h('input', { id: 'volume-size', placeholder: '1G', size: 6 });
  const btn = h('button', { id: 'volume-create-btn', type: 'submit' }, 'Create volume');
  let load;
  const form = h('form', {
    id: 'volume-form', class: 'card row',
    onsubmit: (ev) => {
      ev.preventDefault();
      const body = { name: name.value.trim() };
      if (size.value.trim()) body.size = size.value.trim();
      act(btn, 'Create volume', async () => { const v = await api('POST', '/volumes', body); name.value = ''; return `Created volume ${v.name}.`; }, load);
    },
  }, h('label', {}, 'Name ', name), h('label', {}, 'Size ', size), btn);
  page('Volumes', form,
    h('p', { class: 'muted note' }, 'Named persistent volumes; mount one into a sandbox with volumeMounts on create.'),
    table('volumes', ['Volume', 'ID', 'Use', 'Mounted by', 'Created', ''], tbody), st.el);
  load = refresher(st, async () => {
    const list = await api('GET', '/volumes');
    tbody.replaceChildren(...list.map((v) => {
      const del = h('button', { class: 'small danger delete' }, 'Delete');
      del.onclick = () => {
        if (!confirm(`Delete volume ${v.name} and its data?`)) return;
        act(del, 'Delete', async () => { await api('DELETE', `/volumes/${encodeURIComponent(v.volumeID)}`); return `Deleted volume ${v.name}.`; }, load);
      };
      const total = v.sizeMB * 1024 * 1024;
      return h('tr', { dataset: { name: v.name, id: v.volumeID } },
        h('td', { class: 'name' }, v.name),
        h('td', { class: 'mono' }, v.volumeID),
        h('td', { class: 'usage' }, meter(`volume-use-${v.volumeID}`, [{ label: 'used', value: v.usedBytes, cls: 'used' }], total, fmtBytes)),
        h('td', { class: 'used-by' }, (v.usedBy || []).length
          ? (v.usedBy || []).flatMap((id, i) => [i ? ', ' : '', h('a', { href: `#/sandbox/${id}`, class: 'mono' }, id)])
          : h('span', { class: 'muted' }, 'no sandbox')),
        h('td', {}, fmtTime(v.createdAt)),
        h('td', {}, del));
    }));
    st.set(list.length ? plural(list.length, 'volume') + '.' : 'No volumes yet.');
  });
}

// ---------- pools ----------

export function poolsView() {
  const tbody = h('tbody');
  const st = status('pools-status');
  const tpl = h('select', { id: 'pool-template' });
  const size = h('input', { id: 'pool-size', type: 'number', min: '0', max: '64', value: '1' });
  const btn = h('button', { id: 'pool-set-btn', type: 'submit' }, 'Set pool size');
  let load;
  const setSize = (template, n, b) => act(b, `Resize ${template}`, async () => {
    const p = await api('PUT', `/pools/${encodeURIComponent(template)}`, { size: n });
    return n === 0 ? `Removed the pool of ${template}.` : `The pool of ${template} keeps ${plural(p.size, 'sandbox', 'sandboxes')} ready.`;
  }, load);
  const form = h('form', {
    id: 'pool-form', class: 'card row',
    onsubmit: (ev) => { ev.preventDefault(); setSize(tpl.value, Number(size.value), btn); },
  }, h('label', {}, 'Template ', tpl), h('label', {}, 'Size ', size), btn);
  page('Warm pools', form,
    h('p', { class: 'muted note' }, 'A warm pool keeps sandboxes of a template started, so a create of it is a hand-out. '
      + 'Misses are creates that found the pool empty and went cold. Sizing a pool takes the admin key.'),
    table('pools', ['Template', 'Size', 'Ready', 'Filling', 'Handed out', 'Misses', 'Last error', 'Resize'], tbody), st.el);
  api('GET', '/templates').then((ts) => tpl.replaceChildren(...ts.map((t) => h('option', { value: t.templateID }, t.templateID)))).catch((e) => st.fail(e));
  load = refresher(st, async () => {
    const list = await api('GET', '/pools');
    tbody.replaceChildren(...list.map((p) => {
      const n = h('input', { type: 'number', min: '0', max: '64', value: String(p.size), class: 'resize', 'aria-label': `size of ${p.template}` });
      const b = h('button', { class: 'small resize-btn' }, 'Resize');
      b.onclick = () => setSize(p.template, Number(n.value), b);
      return h('tr', { dataset: { template: p.template } },
        h('td', { class: 'mono' }, p.template),
        h('td', { class: 'size' }, String(p.size)),
        h('td', { class: 'ready' }, String(p.ready)),
        h('td', { class: 'filling' }, String(p.filling)),
        h('td', { class: 'handed' }, String(p.handedOut)),
        h('td', { class: 'misses' }, String(p.misses)),
        h('td', { class: p.lastError ? 'error' : 'muted' }, p.lastError || '—'),
        h('td', { class: 'row' }, n, b));
    }));
    st.set(list.length ? plural(list.length, 'pool') + '.' : 'No warm pools.');
  });
}

// ---------- API keys ----------

const QUOTA_FIELDS = [
  ['maxSandboxes', 'Max sandboxes', 'number'], ['maxVcpus', 'Max vCPUs', 'number'], ['maxMemoryMB', 'Max memory (MiB)', 'number'],
  ['createRate', 'Create rate', 'text', '60/m'], ['requestRate', 'Request rate', 'text', '100/s'],
];

// quotaInputs are the inputs of a key's quota, filled from k (a key) when given.
function quotaInputs(prefix, k) {
  return QUOTA_FIELDS.map(([f, label, type, ph]) => {
    const v = k ? k[f] : '';
    const input = h('input', { id: `${prefix}-${f}`, name: f, type, min: type === 'number' ? '0' : undefined, placeholder: ph || '∞', value: v ? String(v) : '' });
    return { f, type, label, input };
  });
}

// quotaBody is what the inputs say; an empty one is "unlimited" (0 or "")
// when all, or left out (create) when not.
function quotaBody(inputs, all) {
  const body = {};
  for (const { f, type, input } of inputs) {
    const v = input.value.trim();
    if (!v && !all) continue;
    body[f] = type === 'number' ? Number(v || 0) : v;
  }
  return body;
}

const limit = (used, max, fmt = String) => `${fmt(used)} of ${max ? fmt(max) : '∞'}`;

export function keysView() {
  const tbody = h('tbody');
  const st = status('keys-status');
  const name = h('input', { id: 'key-name', required: true, placeholder: 'name' });
  const team = h('input', { id: 'key-team', placeholder: 'its own' });
  const quota = quotaInputs('key');
  const btn = h('button', { id: 'key-create-btn', type: 'submit' }, 'Create key');
  // The secret of a key just made: shown here once, never again (the
  // daemon keeps its hash only).
  const secretBox = h('div', { id: 'new-key', class: 'card secret-once', hidden: true });
  let load;
  const form = h('form', {
    id: 'key-form', class: 'card row',
    onsubmit: (ev) => {
      ev.preventDefault();
      const body = { name: name.value.trim(), ...quotaBody(quota, false) };
      if (team.value.trim()) body.team = team.value.trim();
      act(btn, 'Create key', async () => {
        const k = await api('POST', '/keys', body);
        const code = h('code', { id: 'new-key-secret', class: 'mono' }, k.key);
        secretBox.replaceChildren(
          h('strong', {}, `The key ${k.name}: copy it now, it is not shown again.`), ' ', code, ' ',
          h('button', { class: 'small', onclick: () => navigator.clipboard?.writeText(k.key).then(() => flash('Copied.')).catch(() => {}) }, 'Copy'), ' ',
          h('button', { class: 'small ghost', id: 'new-key-done', onclick: () => { secretBox.hidden = true; secretBox.replaceChildren(); } }, 'Done'));
        secretBox.hidden = false;
        name.value = '';
        return `Created key ${k.name} (${k.id}).`;
      }, load);
    },
  }, h('label', {}, 'Name ', name), h('label', {}, 'Team ', team), quota.map((q) => h('label', {}, `${q.label} `, q.input)), btn);
  page('API keys', form, secretBox,
    h('p', { class: 'muted note' }, 'Each key\'s use now against its quota (running sandboxes, their vCPUs and memory) and its rates. '
      + 'A request past a limit gets a 429 naming it. The admin key is unlimited.'),
    table('keys', ['Key', 'ID', 'Team', 'Sandboxes', 'vCPUs', 'Memory', 'Create rate', 'Request rate', 'Created', ''], tbody), st.el);
  const editing = new Set(); // keys whose quota form is open: not redrawn under the user
  load = refresher(st, async () => {
    const list = await api('GET', '/keys');
    const rows = [];
    for (const k of list) {
      const admin = k.id === 'admin';
      const u = k.usage || {};
      const revoke = h('button', { class: 'small danger revoke', hidden: admin }, 'Revoke');
      revoke.onclick = () => {
        if (!confirm(`Revoke key ${k.name}? It stops authenticating at once.`)) return;
        act(revoke, 'Revoke', async () => { await api('DELETE', `/keys/${encodeURIComponent(k.id)}`); return `Revoked key ${k.name}.`; }, load);
      };
      const edit = h('button', { class: 'small edit', hidden: admin }, 'Edit quota');
      rows.push(h('tr', { dataset: { id: k.id, name: k.name } },
        h('td', { class: 'name' }, k.name),
        h('td', { class: 'mono' }, k.id),
        h('td', {}, k.team),
        h('td', { class: 'sandboxes' }, limit(u.sandboxes || 0, k.maxSandboxes)),
        h('td', { class: 'vcpus' }, limit(u.vcpus || 0, k.maxVcpus)),
        h('td', { class: 'memory' }, limit(u.memoryMB || 0, k.maxMemoryMB, (n) => `${n} MiB`)),
        h('td', { class: 'create-rate' }, k.createRate || '∞'),
        h('td', { class: 'request-rate' }, k.requestRate || '∞'),
        h('td', {}, fmtTime(k.createdAt)),
        h('td', { class: 'actions' }, edit, ' ', revoke)));
      if (editing.has(k.id)) {
        rows.push(document.getElementById(`quota-row-${k.id}`));
        continue;
      }
      edit.onclick = () => {
        editing.add(k.id);
        const ins = quotaInputs(`quota-${k.id}`, k);
        const save = h('button', { class: 'small save', type: 'submit' }, 'Save quota');
        const close = () => { editing.delete(k.id); load(); };
        const f = h('form', {
          class: 'row quota-form',
          onsubmit: (ev) => {
            ev.preventDefault();
            act(save, 'Quota', async () => { await api('PATCH', `/keys/${encodeURIComponent(k.id)}`, quotaBody(ins, true)); editing.delete(k.id); return `Saved the quota of ${k.name}.`; }, load);
          },
        }, ins.map((q) => h('label', {}, `${q.label} `, q.input)), save, h('button', { type: 'button', class: 'small ghost', onclick: close }, 'Cancel'));
        const tr = h('tr', { id: `quota-row-${k.id}`, class: 'quota-edit' }, h('td', { colspan: '10' }, f));
        edit.closest('tr').after(tr);
      };
    }
    tbody.replaceChildren(...rows.filter(Boolean));
    st.set(plural(list.length, 'key') + '.');
  });
}

// ---------- secrets ----------

export function secretsView() {
  const tbody = h('tbody');
  const st = status('secrets-status');
  const name = h('input', { id: 'secret-name', required: true, placeholder: 'NAME' });
  const value = h('input', { id: 'secret-value', type: 'password', required: true, autocomplete: 'off', placeholder: 'value' });
  const btn = h('button', { id: 'secret-create-btn', type: 'submit' }, 'Add secret');
  let load;
  const form = h('form', {
    id: 'secret-form', class: 'card row',
    onsubmit: (ev) => {
      ev.preventDefault();
      const body = { name: name.value.trim(), value: value.value };
      value.value = ''; // not kept in the page a moment longer than the request
      act(btn, 'Add secret', async () => { const s = await api('POST', '/secrets', body); name.value = ''; return `Added secret ${s.name}.`; }, load);
    },
  }, h('label', {}, 'Name ', name), h('label', {}, 'Value ', value), btn);
  page('Secrets', form,
    h('p', { class: 'muted note' }, 'Secrets are stored encrypted and never shown again, here or in any answer of the API: '
      + 'setting a value makes its next version. Sandboxes use them as ${e2b.secrets.NAME}.'),
    table('secrets', ['Secret', 'ID', 'Version', 'Updated', 'New value', ''], tbody), st.el);
  const typing = new Map(); // secret ID → a value being typed, kept across redraws
  load = refresher(st, async () => {
    const list = await api('GET', '/secrets?limit=100');
    if (document.activeElement?.classList.contains('new-value')) return; // not under the user's fingers
    tbody.replaceChildren(...list.map((s) => {
      const nv = h('input', { type: 'password', class: 'new-value', autocomplete: 'off', placeholder: 'new value', 'aria-label': `new value of ${s.name}` });
      nv.value = typing.get(s.secretID) || '';
      nv.oninput = () => typing.set(s.secretID, nv.value);
      const set = h('button', { class: 'small set', type: 'submit' }, 'Set');
      const f = h('form', {
        class: 'row',
        onsubmit: (ev) => {
          ev.preventDefault();
          const v = nv.value;
          nv.value = '';
          typing.delete(s.secretID);
          act(set, `Set ${s.name}`, async () => { const r = await api('POST', `/secrets/${encodeURIComponent(s.secretID)}`, { value: v }); return `Set ${s.name}: version ${r.currentVersion}.`; }, load);
        },
      }, nv, set);
      const del = h('button', { class: 'small danger delete' }, 'Delete');
      del.onclick = () => {
        if (!confirm(`Delete secret ${s.name}?`)) return;
        act(del, 'Delete', async () => { await api('DELETE', `/secrets/${encodeURIComponent(s.secretID)}`); return `Deleted secret ${s.name}.`; }, load);
      };
      return h('tr', { dataset: { name: s.name, id: s.secretID } },
        h('td', { class: 'name mono' }, s.name),
        h('td', { class: 'mono' }, s.secretID),
        h('td', { class: 'version' }, String(s.currentVersion)),
        h('td', {}, fmtTime(s.updatedAt)),
        h('td', {}, f),
        h('td', {}, del));
    }));
    st.set(list.length ? plural(list.length, 'secret') + '.' : 'No secrets yet.');
  });
}

// ---------- the host ----------

export function hostView() {
  const st = status('host-status');
  const states = h('div', { id: 'host-states' });
  const memory = h('div', { id: 'host-memory' });
  const egress = h('div', { id: 'host-egress' });
  const creates = chartSVG('chart-creates', 'creates per minute, last hour');
  const createsNote = h('p', { class: 'muted note', id: 'creates-total' });
  page('Host',
    h('div', { class: 'cols' },
      h('section', { class: 'card' }, h('h3', {}, 'Sandboxes by state'), states),
      h('section', { class: 'card' }, h('h3', {}, 'Memory'), h('p', { class: 'muted note' }, 'The running sandboxes\' memory ceilings, committed, and what they use, against the host\'s RAM.'), memory),
      h('section', { class: 'card' }, h('h3', {}, 'Creates per minute (last hour)'), creates, createsNote),
      h('section', { class: 'card' }, h('h3', {}, 'Egress'), h('p', { class: 'muted note' }, 'The egress proxy\'s decisions since the daemon started.'), egress)),
    st.el);
  refresher(st, async () => {
    const o = await api('GET', '/overview');
    const sb = o.sandboxes || {};
    states.replaceChildren(meter('meter-states', Object.keys(sb).sort().map((k) => ({ label: k, value: sb[k], cls: `st-${k}` })), 0));
    const mem = o.memory;
    memory.replaceChildren(meter('meter-memory', [
      { label: 'used', value: mem.usedMB, cls: 'used' },
      { label: 'committed, unused', value: Math.max(0, mem.committedMB - mem.usedMB), cls: 'committed' },
    ], mem.hostMB, (n) => fmtBytes(n * 1024 * 1024)), h('p', { class: 'muted note', id: 'memory-committed', dataset: { committed: mem.committedMB } },
      `${fmtBytes(mem.committedMB * 1024 * 1024)} committed of ${fmtBytes(mem.hostMB * 1024 * 1024)}; at most ${fmtBytes(mem.maxMB * 1024 * 1024)} per sandbox.`));
    barChart(creates, o.creates.perMinute, o.creates.start, 60);
    const total = o.creates.perMinute.reduce((a, b) => a + b, 0);
    createsNote.textContent = `${plural(total, 'create')} in the last hour (forks included).`;
    createsNote.dataset.total = String(total);
    egress.replaceChildren(o.egress
      ? meter('meter-egress', [{ label: 'allowed', value: o.egress.allowed, cls: 'allowed' }, { label: 'blocked', value: o.egress.blocked, cls: 'blocked' }], 0)
      : h('p', { class: 'muted' }, 'No egress proxy: sandboxes have no network.'));
    st.set(`Updated ${new Date().toLocaleTimeString()}; ${plural(Object.values(sb).reduce((a, b) => a + b, 0), 'sandbox', 'sandboxes')}.`);
  });
}
