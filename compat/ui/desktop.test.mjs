// The console's desktop view in headless Chromium: a sandbox of the
// desktop template shows, beside its terminal, a Desktop panel whose Start
// button runs cella-desktop-stream in the sandbox (Xvfb, Xfce, x11vnc,
// noVNC, as @e2b/desktop's create and stream.start() do) and then connects
// the bundled noVNC client to the stream at the sandbox's preview host.
// The test checks the pixels of a screenshot of the view (a drawn desktop,
// not a blank), and that a click reaches the sandbox's pointer only once
// Interactive is ticked (xdotool in the console's terminal says where the
// pointer is).
// run.sh starts the daemon and sets CELLA_UI_URL, CELLA_UI_KEY, CELLA_UI_SHOTS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { decodePng, distinctColors } from '../e2b/lib/png.mjs';
import { URL_, KEY, SHOTS, call, launch } from './lib.mjs';

let page, sandboxID, errors;
let closeBrowser = async () => {};

before(async () => {
  ({ page, errors, close: closeBrowser } = await launch());
});

after(async () => {
  if (sandboxID) {
    await page?.screenshot({ path: join(SHOTS, 'desktop-failure.png'), fullPage: true }).catch(() => {});
    await call('DELETE', `/sandboxes/${sandboxID}`).catch(() => {});
  }
  await closeBrowser();
});

test('a desktop sandbox\'s page shows its live desktop beside the terminal', async () => {
  // The first create of the template builds it (minutes, once per machine).
  const created = await call('POST', '/sandboxes', { templateID: 'desktop', timeout: 900 });
  assert.equal(created.status, 201, created.text);
  sandboxID = created.json.sandboxID;
  assert.equal(created.json.memoryMB ?? 2048, 2048);

  await page.goto(`${URL_}/ui/`);
  await page.locator('#api-key').fill(KEY);
  await page.locator('#login-btn').click();
  await page.locator('#create-form').waitFor();
  await page.evaluate((id) => { location.hash = `#/sandbox/${id}`; }, sandboxID);
  await page.locator('#sandbox-id').filter({ hasText: sandboxID }).waitFor();
  // The panel sits in the terminal's row.
  await page.locator('#term-row.cols #desktop').waitFor();
  await page.locator('#term-row.cols #terminal').waitFor();
  await page.locator('#desktop-status').filter({ hasText: 'not running' }).waitFor();
  await page.locator('#desktop-start').click();

  // noVNC's RFB client connects to the stream and draws the screen on its
  // canvas inside the panel.
  const view = page.locator('#desktop-view');
  await page.locator('#desktop-view[data-connected="true"] canvas').waitFor({ timeout: 120000 }).catch(async (e) => {
    await page.screenshot({ path: join(SHOTS, 'desktop-not-connected.png'), fullPage: true });
    e.message += `\nstatus: ${await page.locator('#desktop-status').textContent()}; the page's errors: ${JSON.stringify(errors)}`;
    throw e;
  });
  assert.match(await page.locator('#desktop-status').textContent(), /live, view only/);
  let img = null;
  const deadline = Date.now() + 90000;
  for (;;) {
    const png = await view.screenshot();
    img = decodePng(png);
    // Xfce's panels, icons and their text: a blank view or a black screen
    // has a handful of colours.
    if (distinctColors(img) > 60) break;
    if (Date.now() > deadline) {
      writeFileSync(join(SHOTS, 'desktop-view-blank.png'), png);
      assert.fail(`the desktop view stays blank: ${distinctColors(img)} colours`);
    }
    await page.waitForTimeout(500);
  }
  await page.screenshot({ path: join(SHOTS, 'desktop-page.png'), fullPage: true });
  await view.screenshot({ path: join(SHOTS, 'desktop-view.png') });
  assert.ok(img.width > 300 && img.height > 200, `the view is ${img.width}x${img.height}`);

  // View-only: a click on the view does not reach the sandbox's pointer;
  // interactive: it does. The sandbox's own xdotool, in the terminal, says
  // where its pointer is.
  const box = await view.boundingBox();
  const pointer = async (tag) => {
    await page.locator('#terminal .xterm').click();
    await page.keyboard.type(`echo ${tag}=$(DISPLAY=:0 xdotool getmouselocation)`, { delay: 10 });
    await page.keyboard.press('Enter');
    const re = new RegExp(`^${tag}=x:(\\d+) y:(\\d+)`);
    const line = await page.waitForFunction((src) => {
      const r = new RegExp(src);
      const b = window.cellaTerm?.buffer.active;
      for (let i = 0; b && i < b.length; i++) {
        const m = r.exec(b.getLine(i).translateToString(true).trim());
        if (m) return [Number(m[1]), Number(m[2])];
      }
      return false;
    }, re.source, { timeout: 30000 });
    return line.jsonValue();
  };
  const target = [box.x + box.width * 0.75, box.y + box.height * 0.75];
  await page.mouse.click(...target);
  const still = await pointer('viewonly');
  assert.ok(still[0] < 700 || still[1] < 500, `a view-only click moved the pointer to ${still}`);
  await page.locator('#desktop-interactive').check();
  await page.locator('#desktop-status').filter({ hasText: 'interactive' }).waitFor();
  await page.mouse.move(target[0] - 5, target[1] - 5);
  await page.mouse.click(...target);
  const moved = await pointer('interactive');
  // 3/4 of the 1024x768 screen, scaled into the view.
  assert.ok(Math.abs(moved[0] - 768) < 40 && Math.abs(moved[1] - 576) < 40, `an interactive click put the pointer at ${moved}, want near 768,576`);
  // The probe of a stream not started yet is a 502 the browser logs.
  assert.deepEqual(errors.filter((e) => !/favicon|502 \(Bad Gateway\) \(http:\/\/[^)]*\/vnc\.html\)/.test(e)), []);
}, { timeout: 1_500_000 });

test('kill the desktop sandbox', async () => {
  const r = await call('DELETE', `/sandboxes/${sandboxID}`);
  assert.equal(r.status, 204);
  sandboxID = null;
});
