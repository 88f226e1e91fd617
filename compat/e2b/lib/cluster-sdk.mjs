// The e2b@2.51.0 SDK pointed at the cluster's gateway for internal/gateway's
// cluster tests (cluster-build.mjs, cluster-tags.mjs): CELLA_E2B_URL (a
// loopback gateway only) and the key CELLA_E2B_KEY, plus the variables each
// script names in required.
export async function clusterSDK (...required) {
  const missing = ['CELLA_E2B_URL', 'CELLA_E2B_KEY', ...required].filter((v) => !process.env[v])
  if (missing.length) throw new Error(`${missing.join(', ')} must be set`)
  const url = process.env.CELLA_E2B_URL
  if (!['127.0.0.1', 'localhost'].includes(new URL(url).hostname)) throw new Error(`refusing a non-loopback gateway: ${url}`)
  process.env.E2B_API_URL = url
  process.env.E2B_API_KEY = process.env.CELLA_E2B_KEY
  delete process.env.E2B_DOMAIN
  delete process.env.E2B_ACCESS_TOKEN
  return import('e2b-2.51.0')
}
