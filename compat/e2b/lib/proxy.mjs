// A tiny logging reverse proxy between the E2B SDK and the cella daemon.
//
// E2B_API_URL and E2B_SANDBOX_URL point here; every request is forwarded
// verbatim (same method, path, headers, Host) to the daemon, and bodies are
// piped both ways, never buffered, so Connect server streams, chunked uploads
// and long-lived responses behave as without the proxy. For each exchange it
// records the method, path, key headers, a head+tail excerpt of both bodies
// and the status, so a failing test can show what cella received and answered.
import http from 'node:http'
import zlib from 'node:zlib'

const REQ_HEADERS = [
  'host', 'content-type', 'content-encoding', 'content-length', 'transfer-encoding',
  'accept-encoding', 'connect-protocol-version', 'connect-timeout-ms', 'keepalive-ping-interval',
  'e2b-sandbox-id', 'e2b-sandbox-port', 'authorization', 'x-access-token', 'x-api-key',
]
const RES_HEADERS = ['content-type', 'content-encoding', 'content-length', 'transfer-encoding', 'x-next-token', 'retry-after']
const SECRET = new Set(['x-access-token', 'x-api-key'])

function pick (headers, names) {
  const out = {}
  for (const n of names) {
    if (headers[n] === undefined) continue
    const v = String(headers[n])
    out[n] = SECRET.has(n) ? `${v.slice(0, 8)}…(${v.length} chars)` : v
  }
  return out
}

// Keeps the first HEAD and the last TAIL bytes of a body and counts the rest.
class Excerpt {
  static HEAD = 700
  static TAIL = 300
  constructor () { this.head = []; this.headLen = 0; this.tail = Buffer.alloc(0); this.total = 0 }
  add (chunk) {
    this.total += chunk.length
    if (this.headLen < Excerpt.HEAD) {
      const take = chunk.subarray(0, Excerpt.HEAD - this.headLen)
      this.head.push(take); this.headLen += take.length
      chunk = chunk.subarray(take.length)
    }
    if (chunk.length) {
      const t = Buffer.concat([this.tail, chunk])
      this.tail = t.subarray(Math.max(0, t.length - Excerpt.TAIL))
    }
  }
  // The whole body if it fit in the excerpt, else null.
  complete () {
    if (this.total > this.headLen + this.tail.length) return null
    return Buffer.concat([...this.head, this.tail])
  }
  // The body as text: gunzipped when it was sent gzip-encoded (complete
  // bodies only); for parsing JSON answers in assertions.
  text (encoding) {
    const buf = this.complete()
    if (!buf) return null
    if (encoding === 'gzip') {
      try { return zlib.gunzipSync(buf, { finishFlush: zlib.constants.Z_SYNC_FLUSH }).toString('utf8') } catch { return null }
    }
    return buf.toString('utf8')
  }
  toString (encoding) {
    if (this.total === 0) return ''
    if (encoding === 'gzip') {
      const t = this.text('gzip')
      if (t !== null) return `(gzip, decoded) ${render(Buffer.from(t))}`
    }
    const head = render(Buffer.concat(this.head))
    if (this.total <= this.headLen + this.tail.length) return head + render(this.tail)
    return `${head} …[${this.total - this.headLen - this.tail.length} bytes]… ${render(this.tail)}`
  }
}

// Printable ASCII as is, everything else as \xNN (Connect envelopes show as
// \x00\x00\x00\x00\x1f{...}; \x02 marks the end-stream frame).
function render (buf) {
  let s = ''
  for (const b of buf) {
    if (b >= 0x20 && b < 0x7f && b !== 0x5c) s += String.fromCharCode(b)
    else if (b === 0x0a) s += '\\n'
    else if (b === 0x0d) s += '\\r'
    else s += '\\x' + b.toString(16).padStart(2, '0')
  }
  return s
}

export async function startProxy (targetUrl) {
  const target = new URL(targetUrl)
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 })
  const exchanges = []
  const state = { label: '' }

  const server = http.createServer((req, res) => {
    const ex = {
      n: exchanges.length + 1,
      label: state.label,
      t0: Date.now(),
      ms: null,
      method: req.method,
      url: req.url,
      reqHeaders: pick(req.headers, REQ_HEADERS),
      reqBody: new Excerpt(),
      status: null,
      resHeaders: {},
      resBody: new Excerpt(),
      done: false,
      note: '',
    }
    exchanges.push(ex)
    const up = http.request({
      host: target.hostname,
      port: target.port,
      method: req.method,
      path: req.url,
      headers: req.headers,
      agent,
    }, (ures) => {
      ex.status = ures.statusCode
      ex.resHeaders = pick(ures.headers, RES_HEADERS)
      const headers = { ...ures.headers }
      delete headers.connection
      delete headers['keep-alive']
      res.writeHead(ures.statusCode, ures.statusMessage, headers)
      ures.on('data', (c) => ex.resBody.add(c))
      ures.on('end', () => { ex.done = true; ex.ms = Date.now() - ex.t0 })
      ures.on('error', (e) => { ex.note += ` upstream response error: ${e.message};`; res.destroy() })
      ures.pipe(res)
    })
    up.on('error', (e) => {
      ex.note += ` proxy→cella error: ${e.message};`
      ex.ms = Date.now() - ex.t0
      // Let the SDK see a broken connection, not a made-up HTTP status.
      res.destroy()
    })
    req.on('data', (c) => ex.reqBody.add(c))
    req.on('error', () => up.destroy())
    req.pipe(up)
    res.on('close', () => {
      if (!res.writableFinished) {
        ex.note += ' client closed the connection before the response ended;'
        ex.ms ??= Date.now() - ex.t0
        up.destroy()
      }
    })
  })
  server.keepAliveTimeout = 70_000
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  const url = `http://127.0.0.1:${server.address().port}`

  return {
    url,
    exchanges,
    set label (l) { state.label = l },
    get label () { return state.label },
    mark: () => exchanges.length,
    since: (mark) => exchanges.slice(mark),
    async close () {
      server.closeAllConnections?.()
      await new Promise((resolve) => server.close(resolve))
      agent.destroy()
    },
  }
}

// Formats exchanges for a failure report; a run of identical exchanges
// (a polling loop) is shown once with its count.
export function formatExchanges (exchanges) {
  const out = []
  let prev = null
  let repeats = 0
  const key = (ex) => [ex.label, ex.method, ex.url, ex.status, ex.resBody.toString()].join('\u0000')
  const flush = () => { if (repeats) out.push(`    … the same exchange ${repeats} more time${repeats > 1 ? 's' : ''}`); repeats = 0 }
  for (const ex of exchanges) {
    if (prev && key(prev) === key(ex)) { repeats++; continue }
    flush()
    out.push(formatExchange(ex))
    prev = ex
  }
  flush()
  return out.join('\n')
}

export function formatExchange (ex) {
  const lines = []
  const head = Object.entries(ex.reqHeaders).map(([k, v]) => `${k}: ${v}`).join('; ')
  lines.push(`#${ex.n} [${ex.label || '-'}] ${ex.method} ${ex.url}`)
  lines.push(`    > ${head}`)
  const rb = ex.reqBody.toString(ex.reqHeaders['content-encoding'])
  if (rb) lines.push(`    > body (${ex.reqBody.total} B): ${rb}`)
  if (ex.status === null) {
    lines.push(`    < (no response)${ex.note}`)
  } else {
    const rh = Object.entries(ex.resHeaders).map(([k, v]) => `${k}: ${v}`).join('; ')
    const state = ex.done ? `${ex.ms} ms` : 'still streaming'
    lines.push(`    < ${ex.status} (${state}) ${rh}${ex.note}`)
    const sb = ex.resBody.toString(ex.resHeaders['content-encoding'])
    if (sb) lines.push(`    < body (${ex.resBody.total} B): ${sb}`)
  }
  return lines.join('\n')
}
