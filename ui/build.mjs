// Bundles the console into ../internal/ui/dist, which the daemon embeds
// (go:embed) and serves at /ui/.  `npm run build`; `make build` runs it.
import * as esbuild from 'esbuild';
import { copyFileSync, mkdirSync, rmSync } from 'node:fs';

const out = new URL('../internal/ui/dist/', import.meta.url).pathname;
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: { app: 'src/app.js' },
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['es2020', 'chrome100', 'firefox100', 'safari15'],
  outdir: out,
  legalComments: 'eof',
  logLevel: 'warning',
});
copyFileSync('src/index.html', out + 'index.html');
