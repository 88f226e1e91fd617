// What the console's test files share: the daemon's coordinates from
// run.sh, the REST API as a test checks it beside the console, and a fresh
// headless Chromium whose page errors are collected.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

export const URL_ = process.env.CELLA_UI_URL;
export const KEY = process.env.CELLA_UI_KEY;
export const SHOTS = process.env.CELLA_UI_SHOTS || join(tmpdir(), 'cella-ui-screenshots');
const CHROMIUM = process.env.CELLA_UI_CHROMIUM || '/usr/bin/chromium';
assert.ok(URL_ && KEY, 'CELLA_UI_URL and CELLA_UI_KEY must be set (use run.sh)');
mkdirSync(SHOTS, { recursive: true });

// call is the REST API as a test checks it, beside the console.
export async function call(method, path, body, key = KEY) {
  const init = { method, headers: { 'X-API-Key': key } };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(URL_ + path, init);
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text };
}

// launch starts Chromium on a fresh profile (--user-data-dir: playwright
// takes it as the persistent context's directory) and returns {browser,
// page, errors, close}; errors collects the page's errors and console
// errors.
export async function launch(options = {}) {
  const profile = mkdtempSync(join(tmpdir(), 'cella-ui-chromium-'));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1400, height: 1000 },
    ...options,
  });
  const page = browser.pages()[0] || await browser.newPage();
  page.setDefaultTimeout(30000);
  const errors = [];
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(`console: ${m.text()} (${m.location()?.url || ''})`); });
  const close = async () => {
    await browser.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { browser, page, errors, close };
}
