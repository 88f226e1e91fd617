// A small PNG reader for the desktop tests: the header (signature, IHDR)
// checked byte by byte, and the pixels of the 8-bit RGB/RGBA images scrot
// and Chromium write, so a test can compare regions of two screenshots or
// tell a blank image from a drawn one. Not a general decoder: other
// formats are an error naming what was found.
import zlib from 'node:zlib'

const SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

// pngHeader returns {width, height, bitDepth, colorType} from the IHDR
// chunk, or throws saying what is wrong.
export function pngHeader (buf) {
  buf = Buffer.from(buf)
  if (buf.length < 33) throw new Error(`not a PNG: ${buf.length} bytes`)
  if (!buf.subarray(0, 8).equals(SIGNATURE)) throw new Error(`not a PNG: signature ${buf.subarray(0, 8).toString('hex')}`)
  if (buf.readUInt32BE(8) !== 13 || buf.toString('latin1', 12, 16) !== 'IHDR') throw new Error('PNG without IHDR first')
  return { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20), bitDepth: buf[24], colorType: buf[25], interlace: buf[28] }
}

// decodePng returns {width, height, channels, pixels} (pixels: rows of
// width*channels bytes, top first).
export function decodePng (buf) {
  buf = Buffer.from(buf)
  const h = pngHeader(buf)
  const channels = { 2: 3, 6: 4 }[h.colorType]
  if (h.bitDepth !== 8 || !channels || h.interlace !== 0) {
    throw new Error(`unsupported PNG: bit depth ${h.bitDepth}, color type ${h.colorType}, interlace ${h.interlace}`)
  }
  const idat = []
  for (let off = 8; off < buf.length;) {
    const len = buf.readUInt32BE(off)
    const type = buf.toString('latin1', off + 4, off + 8)
    if (type === 'IDAT') idat.push(buf.subarray(off + 8, off + 8 + len))
    if (type === 'IEND') break
    off += 12 + len
  }
  const raw = zlib.inflateSync(Buffer.concat(idat))
  const stride = h.width * channels
  if (raw.length !== (stride + 1) * h.height) throw new Error(`PNG data is ${raw.length} bytes, want ${(stride + 1) * h.height}`)
  const px = Buffer.alloc(stride * h.height)
  for (let y = 0; y < h.height; y++) {
    const filter = raw[y * (stride + 1)]
    const src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const row = px.subarray(y * stride, (y + 1) * stride)
    const prev = y > 0 ? px.subarray((y - 1) * stride, y * stride) : Buffer.alloc(stride)
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? row[i - channels] : 0
      const b = prev[i]
      const c = i >= channels ? prev[i - channels] : 0
      let v
      switch (filter) {
        case 0: v = 0; break
        case 1: v = a; break
        case 2: v = b; break
        case 3: v = (a + b) >> 1; break
        case 4: { const p = a + b - c; const pa = Math.abs(p - a); const pb = Math.abs(p - b); const pc = Math.abs(p - c); v = pa <= pb && pa <= pc ? a : pb <= pc ? b : c; break }
        default: throw new Error(`PNG row ${y}: unknown filter ${filter}`)
      }
      row[i] = (src[i] + v) & 0xff
    }
  }
  return { width: h.width, height: h.height, channels, pixels: px }
}

// regionDiff counts the pixels of the rectangle [x0,x1)×[y0,y1) whose RGB
// differ between two decoded images of the same size.
export function regionDiff (a, b, [x0, y0, x1, y1]) {
  if (a.width !== b.width || a.height !== b.height) throw new Error(`images differ in size: ${a.width}x${a.height} vs ${b.width}x${b.height}`)
  let n = 0
  for (let y = y0; y < y1; y++) {
    for (let x = x0; x < x1; x++) {
      const i = (y * a.width + x) * a.channels
      const j = (y * b.width + x) * b.channels
      if (a.pixels[i] !== b.pixels[j] || a.pixels[i + 1] !== b.pixels[j + 1] || a.pixels[i + 2] !== b.pixels[j + 2]) n++
    }
  }
  return n
}

// distinctColors counts the distinct RGB colours in a rectangle (a blank
// or single-colour image has 1).
export function distinctColors (img, [x0, y0, x1, y1] = [0, 0, img.width, img.height]) {
  const seen = new Set()
  for (let y = y0; y < y1; y++) {
    for (let x = x0; x < x1; x++) {
      const i = (y * img.width + x) * img.channels
      seen.add((img.pixels[i] << 16) | (img.pixels[i + 1] << 8) | img.pixels[i + 2])
    }
  }
  return seen.size
}
