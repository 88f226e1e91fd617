// The web console end to end in Debian's headless Chromium (playwright-core):
// log in, create a sandbox, type in its terminal, upload a file, read its
// audit log, pause and resume it, kill it. A screenshot of each step goes to
// CELLA_UI_SHOTS.
// run.sh starts the daemon and sets CELLA_UI_URL, CELLA_UI_KEY, CELLA_UI_SHOTS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, writeFileSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const URL_ = process.env.CELLA_UI_URL;
const KEY = process.env.CELLA_UI_KEY;
const SHOTS = process.env.CELLA_UI_SHOTS || join(tmpdir(), 'cella-ui-screenshots');
const CHROMIUM = process.env.CELLA_UI_CHROMIUM || '/usr/bin/chromium';
assert.ok(URL_ && KEY, 'CELLA_UI_URL and CELLA_UI_KEY must be set (use run.sh)');
mkdirSync(SHOTS, { recursive: true });

let browser, page, profile, sandboxID;
let step = 0;
const errors = [];

// shot saves the whole page, or only `of` (a locator) when given.
async function shot(name, of) {
  step++;
  const file = join(SHOTS, `${String(step).padStart(2, '0')}-${name}.png`);
  if (of) await of.screenshot({ path: file });
  else await page.screenshot({ path: file, fullPage: true });
  return file;
}

// termText is what xterm.js shows (its buffer, scrollback included).
const termText = () => page.evaluate(() => {
  const b = window.cellaTerm?.buffer.active;
  if (!b) return '';
  const out = [];
  for (let i = 0; i < b.length; i++) out.push(b.getLine(i)?.translateToString(true) ?? '');
  return out.join('\n');
});

// waitForTermLine waits for a line of the terminal that matches re.
const waitForTermLine = (re, timeout = 30000) => page.waitForFunction((src) => {
  const r = new RegExp(src);
  const b = window.cellaTerm.buffer.active;
  for (let i = 0; i < b.length; i++) if (r.test(b.getLine(i).translateToString(true).trim())) return true;
  return false;
}, re.source, { timeout });

// waitForTermText waits until what the terminal shows (termText) satisfies
// ok, polling it; `what` names the wait in the timeout error.
async function waitForTermText(ok, what, timeout = 30000) {
  const deadline = Date.now() + timeout;
  while (!ok(await termText())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what} in the terminal`);
    await page.waitForTimeout(100);
  }
}

// auditRows is what the audit log table shows: kind, class and text per row.
const auditRows = () => page.locator('#audit tbody tr').evaluateAll((trs) => trs.map((tr) => ({
  kind: tr.dataset.kind, decision: tr.dataset.decision, blocked: tr.classList.contains('blocked'),
  time: tr.querySelector('td.time').title, text: tr.innerText,
})));

// The /logs requests the console makes (the audit log's polling).
let auditRequests = 0;

async function typeInTerminal(text) {
  await page.locator('#terminal .xterm').click();
  await page.keyboard.type(text, { delay: 20 });
  await page.keyboard.press('Enter');
}

before(async () => {
  profile = mkdtempSync(join(tmpdir(), 'cella-ui-chromium-'));
  // A fresh profile (--user-data-dir) each run: playwright takes it as the
  // persistent context's directory.
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1400, height: 1000 },
    acceptDownloads: true,
  });
  page = browser.pages()[0] || await browser.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()}`); });
  page.on('dialog', (d) => d.accept());
  page.on('request', (r) => { if (/\/sandboxes\/[^/]+\/logs\b/.test(new URL(r.url()).pathname)) auditRequests++; });
});

after(async () => {
  if (sandboxID) { // a step failed: keep a picture of it, leave no sandbox behind
    await shot('failure').catch(() => {});
    await fetch(`${URL_}/sandboxes/${sandboxID}`, { method: 'DELETE', headers: { 'X-API-Key': KEY } }).catch(() => {});
  }
  await browser?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
  console.log(`screenshots: ${SHOTS}`);
});

test('a wrong key is refused, the right one logs in', async () => {
  await page.goto(`${URL_}/ui/`);
  await page.locator('#api-key').fill('e2b_0000');
  await page.locator('#login-btn').click();
  await page.locator('#login-error').filter({ hasText: 'not valid' }).waitFor();
  await shot('wrong-key-refused');
  await page.locator('#api-key').fill(KEY);
  await shot('login');
  await page.locator('#login-btn').click();
  await page.locator('#create-form').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('cella.apiKey')), KEY);
  await shot('logged-in');
});

test('create a sandbox from the console', async () => {
  await page.locator('#template').fill('base');
  await page.locator('#create-btn').click();
  const fl = page.locator('#flash .flash');
  await fl.filter({ hasText: 'Created sandbox' }).waitFor({ timeout: 120000 });
  sandboxID = (await fl.textContent()).match(/Created sandbox ([a-z0-9]+)/)[1];
  const row = page.locator(`#sandboxes tr[data-id="${sandboxID}"]`);
  await row.waitFor();
  assert.equal((await row.locator('td.state').textContent()).trim(), 'running');
  assert.equal((await row.locator('td.template').textContent()).trim(), 'base');
  assert.match(await row.locator('td.memory').textContent(), /\d+ MiB/);
  assert.match(await row.locator('td.age').textContent(), /^\d+/);
  await shot('created');
});

test('open it and run echo hello in the terminal', async () => {
  await page.locator(`#sandboxes tr[data-id="${sandboxID}"] a`).first().click();
  await page.locator('#sandbox-id').filter({ hasText: sandboxID }).waitFor();
  await page.locator('#term-status').filter({ hasText: 'connected' }).waitFor();
  await waitForTermText((text) => /[$#] ?$/m.test(text.trimEnd()), 'a shell prompt');
  await typeInTerminal('echo hello');
  await waitForTermLine(/^hello$/);
  const text = await termText();
  assert.match(text, /echo hello\s*\nhello/);
  // The DOM shows it too (the rows xterm.js renders).
  assert.match(await page.locator('#terminal .xterm-rows').innerText(), /hello/);
  await shot('terminal-echo-hello');
});

test('upload a file through the file browser and see it listed', async () => {
  await page.locator('#files-status').filter({ hasText: /entr(y|ies) in \/home\/user/ }).waitFor();
  const dir = mkdtempSync(join(tmpdir(), 'cella-ui-upload-'));
  const local = join(dir, 'hello-from-the-console.txt');
  writeFileSync(local, 'uploaded through the web console\n');
  await page.locator('#upload').setInputFiles(local);
  const row = page.locator('#files tr[data-name="hello-from-the-console.txt"]');
  await row.waitFor();
  await page.locator('#flash .flash').filter({ hasText: 'Uploaded hello-from-the-console.txt' }).waitFor();
  // The file really is in the sandbox: the shell sees it.
  await typeInTerminal('cat ~/hello-from-the-console.txt');
  await waitForTermLine(/^uploaded through the web console$/);
  // And it downloads back.
  const [dl] = await Promise.all([page.waitForEvent('download'), row.locator('button.download').click()]);
  assert.equal(dl.suggestedFilename(), 'hello-from-the-console.txt');
  const saved = join(dir, 'downloaded.txt');
  await dl.saveAs(saved);
  assert.equal(readFileSync(saved, 'utf8'), 'uploaded through the web console\n');
  rmSync(dir, { recursive: true, force: true });
  await shot('file-uploaded');
});

test('the activity panel shows the lifecycle and the shell process with its output', async () => {
  await page.locator('#activity-refresh').click();
  await page.locator('#lifecycle li').filter({ hasText: 'started from template base' }).waitFor();
  const bash = page.locator('#processes tr').filter({ hasText: '/bin/bash' }).first();
  await bash.waitFor();
  await bash.locator('button').click();
  await page.locator('#process-log').filter({ hasText: 'hello' }).waitFor();
  await page.locator('#activity').scrollIntoViewIfNeeded();
  await shot('activity');
});

test('the audit log panel shows the shell, the upload and a blocked lookup, and filters them', async () => {
  const panel = page.locator('#audit-log');
  await panel.scrollIntoViewIfNeeded();
  await page.locator('#audit-filter').selectOption('all');
  // Something the egress policy refuses: run.sh's daemon has no egress
  // ceiling, so the proxy blocks every lookup and connection.
  await typeInTerminal('curl -sS -m 5 http://blocked-by-policy.example/ ; echo curl-rc=$?');
  await waitForTermLine(/^curl-rc=[1-9]\d*$/);
  // The panel refreshes itself (every 3 s): the blocked lookup shows up
  // without a click, marked as blocked.
  const blocked = page.locator('#audit tbody tr.blocked').filter({ hasText: 'blocked-by-policy.example' }).first();
  await blocked.waitFor({ timeout: 30000 });
  assert.equal((await blocked.locator('td.result').textContent()).trim(), 'blocked');
  assert.match(await blocked.locator('td.reason').textContent(), /not allowed/);
  const red = await blocked.locator('td.what').evaluate((td) => getComputedStyle(td).color);
  assert.equal(red, 'rgb(201, 55, 44)'); // --danger
  // Refresh: the shell the terminal started (where `echo hello` ran) and
  // the uploaded file are there.
  await page.locator('#audit-refresh').click();
  const shell = page.locator('#audit tbody tr[data-kind="process.start"]').filter({ hasText: /echo hello|\/bin\/(ba)?sh/ }).first();
  await shell.waitFor();
  const upload = page.locator('#audit tbody tr[data-kind="file.write"]').filter({ hasText: '/home/user/hello-from-the-console.txt' }).first();
  await upload.waitFor();
  assert.equal(await upload.evaluate((tr) => tr.classList.contains('blocked')), false);
  const rows = await auditRows();
  // Rows come in the order the daemon recorded them. That is not strictly
  // by time: the agent's entries keep the agent's own timestamps and reach
  // the daemon a moment later, after entries of its own may have. What does
  // hold: every row has a time, and by their times the shell started before
  // the upload, and the upload came before the blocked lookup (seconds
  // apart: they were separate steps of this run).
  const bad = rows.filter((r) => Number.isNaN(Date.parse(r.time)));
  assert.deepEqual(bad, [], 'every row has a time');
  const timeOf = (what, pred) => {
    const ts = rows.filter(pred).map((r) => Date.parse(r.time));
    assert.ok(ts.length > 0, `no ${what} row in ${JSON.stringify(rows.map((r) => r.kind))}`);
    return Math.min(...ts);
  };
  const shellAt = timeOf('shell process.start', (r) => r.kind === 'process.start' && /echo hello|\/bin\/(ba)?sh/.test(r.text));
  const uploadAt = timeOf('upload file.write', (r) => r.kind === 'file.write' && r.text.includes('/home/user/hello-from-the-console.txt'));
  const blockedAt = timeOf('blocked lookup', (r) => r.blocked && r.text.includes('blocked-by-policy.example'));
  const iso = (t) => new Date(t).toISOString();
  assert.ok(shellAt <= uploadAt, `the shell started at ${iso(shellAt)}, after the upload at ${iso(uploadAt)}`);
  assert.ok(uploadAt <= blockedAt, `the upload at ${iso(uploadAt)} comes after the blocked lookup at ${iso(blockedAt)}`);
  assert.ok(rows.every((r) => r.blocked === (r.decision === 'blocked')), 'exactly the blocked rows are marked');
  await shot('audit-log', panel);
  await shot('audit-log-page');

  // The filter asks the daemon for one kind of entry at a time.
  const only = async (value, pred, what) => {
    await page.locator('#audit-filter').selectOption(value);
    await page.waitForFunction(() => !/Loading/.test(document.getElementById('audit-status').textContent));
    const rs = await auditRows();
    assert.ok(rs.length > 0, `${value}: no rows`);
    assert.ok(rs.every(pred), `${value}: only ${what}, got ${rs.map((r) => r.kind).join(', ')}`);
    return rs;
  };
  await only('commands', (r) => r.kind.startsWith('process.'), 'process.* rows');
  const files = await only('files', (r) => r.kind.startsWith('file.'), 'file.* rows');
  assert.ok(files.some((r) => r.text.includes('hello-from-the-console.txt')));
  await only('network', (r) => r.kind === 'connect' || r.kind === 'dns', 'connect/dns rows');
  await only('blocked', (r) => r.blocked && r.decision === 'blocked', 'blocked rows');
  await shot('audit-log-blocked-only', panel);
  await page.locator('#audit-filter').selectOption('all');
  await shell.waitFor();
});

test('pause and resume from the console', async () => {
  await page.locator('#pause-btn').click();
  await page.locator('#sandbox-state').filter({ hasText: 'paused' }).waitFor({ timeout: 120000 });
  await page.locator('#resume-btn:enabled').waitFor();
  await shot('paused');
  await page.locator('#resume-btn').click();
  await page.locator('#sandbox-state').filter({ hasText: 'running' }).waitFor({ timeout: 120000 });
  await page.locator('#term-status').filter({ hasText: /^connected$/ }).waitFor({ timeout: 60000 });
  // The terminal works after the resume (the same shell re-attached, or a
  // new one). The daemon re-attaches to the shell's output a moment after the
  // resume and output from before that is not replayed, so first press Enter
  // until a fresh prompt shows up, then type.
  const prompts = async () => (await termText()).split('\n').filter((l) => /[$#]\s*$/.test(l)).length;
  const before = await prompts();
  for (let i = 0; i < 30 && await prompts() <= before; i++) {
    await page.locator('#terminal .xterm').click();
    await page.keyboard.press('Enter');
    await page.waitForTimeout(1000);
  }
  assert.ok(await prompts() > before, 'no new prompt in the terminal after the resume');
  await typeInTerminal('echo back-$((40+2))');
  await waitForTermLine(/^back-42$/, 60000);
  // The uploaded file survived the pause.
  await page.locator('#files-refresh').click();
  await page.locator('#files tr[data-name="hello-from-the-console.txt"]').waitFor();
  // What the user sees: the rows xterm.js renders show it too.
  await page.locator('#terminal').scrollIntoViewIfNeeded();
  await page.locator('#terminal .xterm-rows').filter({ hasText: 'back-42' }).waitFor();
  await shot('resumed');
});

test('kill the sandbox and see it gone from the list', async () => {
  await page.locator('#kill-btn').click(); // the confirm() dialog is accepted
  await page.locator('#create-form').waitFor();
  await page.locator('#flash .flash').filter({ hasText: `Killed sandbox ${sandboxID}` }).waitFor();
  await page.locator(`#sandboxes tr[data-id="${sandboxID}"]`).waitFor({ state: 'detached' });
  const r = await fetch(`${URL_}/sandboxes/${sandboxID}`, { headers: { 'X-API-Key': KEY } });
  assert.equal(r.status, 404);
  sandboxID = undefined;
  await shot('killed');
  // Leaving the sandbox page stops the audit log's polling.
  const n = auditRequests;
  await page.waitForTimeout(4000);
  assert.equal(auditRequests, n, 'the audit log kept polling after the page was left');
});

test('log out forgets the key', async () => {
  await page.locator('#logout-btn').click();
  await page.locator('#login-form').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem('cella.apiKey')), null);
  // No script errors on the way (the refused key's 401 is the only expected console error).
  const unexpected = errors.filter((e) => !/401/.test(e));
  assert.deepEqual(unexpected, []);
});
