// One template build through the real, unmodified e2b@2.51.0 Template
// class, for internal/gateway's cluster test (TestClusterTemplates): the
// SDK talks to the gateway at CELLA_E2B_URL with the key CELLA_E2B_KEY and
// builds CELLA_BUILD_ALIAS from the base template with a COPY (so the
// files link and the upload go through the gateway too) and a RUN, asking
// for 1 vCPU and 768 MiB. Optional: CELLA_BUILD_FROM_TEMPLATE, the
// template it is built on instead (fromTemplate); CELLA_BUILD_RUN, one more RUN;
// CELLA_BUILD_START_CMD and CELLA_BUILD_READY_CMD, setStartCmd's; and
// CELLA_BUILD_TAGS, the build's tags (comma-separated). It prints the
// BuildInfo as one JSON line, or exits 1 with the error.
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'

import { clusterSDK } from './cluster-sdk.mjs'

const { Template } = await clusterSDK('CELLA_BUILD_ALIAS')
const alias = process.env.CELLA_BUILD_ALIAS
const ctx = fs.mkdtempSync(path.join(os.tmpdir(), 'cella-cluster-build-'))
try {
  fs.writeFileSync(path.join(ctx, 'hello.txt'), 'copied through the gateway\n')
  const from = Template({ fileContextPath: ctx })
  let t = (process.env.CELLA_BUILD_FROM_TEMPLATE ? from.fromTemplate(process.env.CELLA_BUILD_FROM_TEMPLATE) : from.fromBaseImage())
    .copy('hello.txt', '/home/user/hello.txt')
    .runCmd('echo built-in-the-cluster > /home/user/built.txt')
  if (process.env.CELLA_BUILD_RUN) t = t.runCmd(process.env.CELLA_BUILD_RUN)
  if (process.env.CELLA_BUILD_START_CMD) t = t.setStartCmd(process.env.CELLA_BUILD_START_CMD, process.env.CELLA_BUILD_READY_CMD)
  const logs = []
  // Sizes other than E2B's defaults: a sandbox of it on any node must get them.
  const opts = { cpuCount: 1, memoryMB: 768, onBuildLogs: (e) => logs.push(e.toString()) }
  if (process.env.CELLA_BUILD_TAGS) opts.tags = process.env.CELLA_BUILD_TAGS.split(',')
  const info = await Template.build(t, alias, opts)
  console.log(JSON.stringify({ ...info, logs }))
} catch (err) {
  console.error(err)
  process.exitCode = 1
} finally {
  fs.rmSync(ctx, { recursive: true, force: true })
}
