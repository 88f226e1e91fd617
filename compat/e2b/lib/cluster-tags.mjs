// E2B's tag calls through the real, unmodified e2b@2.51.0 Template class,
// for internal/gateway's cluster tests: against the gateway at
// CELLA_E2B_URL with the key CELLA_E2B_KEY, CELLA_TAG_OP=assign points
// CELLA_TAG_TAGS (comma-separated) at the build CELLA_TAG_NAME
// (alias[:tag]) names, CELLA_TAG_OP=remove removes them from the template
// CELLA_TAG_NAME. It prints the SDK's answer as one JSON line, or exits 1
// with the error.
import { clusterSDK } from './cluster-sdk.mjs'

const { Template } = await clusterSDK('CELLA_TAG_OP', 'CELLA_TAG_NAME', 'CELLA_TAG_TAGS')
const { CELLA_TAG_OP: op, CELLA_TAG_NAME: name, CELLA_TAG_TAGS: tags } = process.env
try {
  if (op === 'assign') {
    console.log(JSON.stringify(await Template.assignTags(name, tags.split(','))))
  } else if (op === 'remove') {
    await Template.removeTags(name, tags.split(','))
    console.log(JSON.stringify({ removed: tags.split(',') }))
  } else {
    throw new Error(`CELLA_TAG_OP must be assign or remove, not ${op}`)
  }
} catch (err) {
  console.error(err)
  process.exitCode = 1
}
