// The start of a VNC (RFB) session through a WebSocket, as noVNC's page
// opens it: an HTTP upgrade to websockify's /websockify, then RFB's
// version exchange and the server's list of security types. Written on a
// plain socket (Node 20 has no WebSocket client that may set Host), to the
// daemon itself: the logging proxy does not pass upgrades.
import net from 'node:net'
import crypto from 'node:crypto'

// rfbGreeting connects to host:port, upgrades path with the given headers
// and returns {status, body} for a refused upgrade, or {status: 101,
// version, securityTypes, reason, authResult} once the server named its
// security types. With tryAuth (VNC authentication offered), it answers the
// challenge with 16 bytes that are no DES of it and reads the result
// (0 = ok, 1 = failed).
export function rfbGreeting ({ host, port, path = '/websockify', headers = {}, tryAuth = false, timeout = 15_000 }) {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host, port })
    const timer = setTimeout(() => { sock.destroy(); reject(new Error(`no RFB greeting within ${timeout} ms`)) }, timeout)
    const done = (v, err) => { clearTimeout(timer); sock.destroy(); err ? reject(err) : resolve(v) }
    sock.on('error', (e) => done(null, e))
    const key = crypto.randomBytes(16).toString('base64')
    const lines = [`GET ${path} HTTP/1.1`, 'Connection: Upgrade', 'Upgrade: websocket', 'Sec-WebSocket-Version: 13',
      `Sec-WebSocket-Key: ${key}`, 'Sec-WebSocket-Protocol: binary', ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)]
    sock.write(lines.join('\r\n') + '\r\n\r\n')
    let buf = Buffer.alloc(0)
    let upgraded = false
    let rfb = Buffer.alloc(0) // the payloads of the server's frames so far
    let stage = 'version'
    const out = { status: 101 }
    const send = (payload) => { // one masked binary frame (payloads < 126 bytes)
      const mask = crypto.randomBytes(4)
      const body = Buffer.from(payload).map((b, i) => b ^ mask[i % 4])
      sock.write(Buffer.concat([Buffer.from([0x82, 0x80 | body.length]), mask, body]))
    }
    sock.on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk])
      if (!upgraded) {
        const end = buf.indexOf('\r\n\r\n')
        if (end < 0) return
        const head = buf.subarray(0, end).toString('latin1')
        const status = Number(head.split(' ')[1])
        if (status !== 101) {
          // The refusal's body follows its headers; wait for all of it.
          const len = Number(/content-length:\s*(\d+)/i.exec(head)?.[1] ?? 0)
          if (buf.length < end + 4 + len) return
          return done({ status, body: buf.subarray(end + 4, end + 4 + len).toString('utf8') })
        }
        upgraded = true
        buf = buf.subarray(end + 4)
      }
      // Unmasked server frames: the payload of each complete one. A close
      // frame may arrive in the same read as the data before it (a server
      // that refused the authentication sends the result, then closes):
      // that data is read first.
      let closed = false
      for (;;) {
        if (buf.length < 2) break
        let len = buf[1] & 0x7f
        let off = 2
        if (len === 126) { if (buf.length < 4) break; len = buf.readUInt16BE(2); off = 4 }
        if (len === 127) { if (buf.length < 10) break; len = Number(buf.readBigUInt64BE(2)); off = 10 }
        if (buf.length < off + len) break
        if ((buf[0] & 0x0f) === 0x8) { closed = true; break }
        rfb = Buffer.concat([rfb, buf.subarray(off, off + len)])
        buf = buf.subarray(off + len)
      }
      if (advance()) return
      if (closed) done(null, new Error(`the server closed the WebSocket during the RFB handshake (at the ${stage} stage, ${rfb.length} bytes unread)`))
    })
    // advance reads what the server sent so far; true once done.
    const advance = () => {
      if (stage === 'version' && rfb.length >= 12) {
        out.version = rfb.subarray(0, 12).toString('latin1')
        rfb = rfb.subarray(12)
        send('RFB 003.008\n')
        stage = 'types'
      }
      if (stage === 'types' && rfb.length >= 1 && rfb.length >= 1 + rfb[0]) {
        out.securityTypes = [...rfb.subarray(1, 1 + rfb[0])]
        rfb = rfb.subarray(1 + rfb[0])
        if (out.securityTypes.length === 0 || !tryAuth || !out.securityTypes.includes(2)) { done(out); return true }
        send([2])
        stage = 'challenge'
      }
      if (stage === 'challenge' && rfb.length >= 16) {
        rfb = rfb.subarray(16)
        send(crypto.randomBytes(16))
        stage = 'result'
      }
      if (stage === 'result' && rfb.length >= 4) {
        out.authResult = rfb.readUInt32BE(0)
        done(out)
        return true
      }
      return false
    }
  })
}
