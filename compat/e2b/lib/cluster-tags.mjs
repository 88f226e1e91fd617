// E2B's tag calls through the real, unmodified e2b@2.51.0 Template class,
// for internal/gateway's cluster tests: against the gateway at
// CELLA_E2B_URL with the key CELLA_E2B_KEY, CELLA_TAG_OP=assign points
// CELLA_TAG_TAGS (comma-separated) at the build CELLA_TAG_NAME
// (alias[:tag]) names, CELLA_TAG_OP=remove removes them from the template
// CELLA_TAG_NAME. It prints the SDK's answer as one JSON line, or exits 1
// with the error.
const url = process.env.CELLA_E2B_URL
const key = process.env.CELLA_E2B_KEY
const { CELLA_TAG_OP: op, CELLA_TAG_NAME: name, CELLA_TAG_TAGS: tags } = process.env
if (!url || !key || !name || !tags) throw new Error('CELLA_E2B_URL, CELLA_E2B_KEY, CELLA_TAG_NAME and CELLA_TAG_TAGS must be set')
if (!['127.0.0.1', 'localhost'].includes(new URL(url).hostname)) throw new Error(`refusing a non-loopback gateway: ${url}`)
process.env.E2B_API_URL = url
process.env.E2B_API_KEY = key
delete process.env.E2B_DOMAIN
delete process.env.E2B_ACCESS_TOKEN

const { Template } = await import('e2b-2.51.0')
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
