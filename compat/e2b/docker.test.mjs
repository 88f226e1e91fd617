// Docker inside a sandbox through the real, unmodified `e2b` SDK: a sandbox
// of the builtin `docker` template (the daemon builds it on first use; make
// test ensures it first), an image made inside from the template's busybox,
// a Dockerfile written with files.write, docker build and docker run through
// commands.run, and a `docker compose` project. Run with ./run.sh.
import { describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { step, sandboxJanitor, closeProxy } from './lib/harness.mjs'

const { Sandbox } = await import('e2b-2.51.0')

describe('e2b@2.51.0 with the docker template', () => {
  const janitor = sandboxJanitor(Sandbox)
  let sbx
  const shared = () => { assert.ok(sbx, 'no shared sandbox: Sandbox.create failed'); return sbx }
  const run = (cmd) => shared().commands.run(cmd, { timeoutMs: 240_000 })

  step("Sandbox.create('docker'): the sandbox's own engine answers as the user", async ({ sdk }) => {
    sbx = janitor.track(await sdk("Sandbox.create('docker')", () => Sandbox.create('docker', { timeoutMs: 600_000 })))
    const info = await sdk('commands.run(docker info)', () => run("docker info --format '{{.KernelVersion}} {{.Driver}}'"))
    assert.equal(info.stdout, '4.19.0-gvisor vfs\n')
  }, { timeout: 900_000 })

  step('files.write a Dockerfile; docker build and docker run through commands.run', async ({ sdk }) => {
    await sdk('commands.run(docker import)', () => run(
      'd=$(mktemp -d) && mkdir $d/bin && cp /bin/busybox $d/bin/ && for a in sh cat echo httpd wget seq sleep; do ln -s busybox $d/bin/$a; done && tar -C $d -c . | docker import - bb'))
    await sdk('files.write(Dockerfile)', () => shared().files.write('/home/user/app/Dockerfile',
      'FROM bb\nRUN echo built-by-e2b > /msg\nCMD ["cat", "/msg"]\n'))
    await sdk('commands.run(docker build)', () => run('cd ~/app && docker build -t app .'))
    const out = await sdk('commands.run(docker run)', () => run('docker run --rm app'))
    assert.equal(out.stdout, 'built-by-e2b\n')
  }, { timeout: 300_000 })

  step('docker compose up of two services that reach each other by name', async ({ sdk }) => {
    await sdk('files.write(compose)', () => shared().files.write('/home/user/proj/docker-compose.yml', [
      'version: "3"',
      'services:',
      '  web:',
      '    image: bb',
      '    command: ["sh", "-c", "echo from-web > /index.html && httpd -f -p 8080 -h /"]',
      '  client:',
      '    image: bb',
      '    depends_on: [web]',
      '    command: ["sh", "-c", "for i in $$(seq 60); do wget -q -O- http://web:8080/index.html && exit 0; sleep 1; done; exit 1"]',
      '',
    ].join('\n')))
    const out = await sdk('commands.run(docker compose up)', () => run(
      'cd ~/proj && docker compose up --no-color --abort-on-container-exit --exit-code-from client 2>&1; rc=$?; docker compose down >/dev/null 2>&1; exit $rc'))
    assert.match(out.stdout, /from-web/)
  }, { timeout: 300_000 })
})

after(closeProxy)
