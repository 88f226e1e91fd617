// Plain-SVG charts for the console: a time-series line chart (the sandbox
// resource samples) and a bar chart (creates per minute). Hand-written
// rather than a charting library: the console is embedded in the daemon,
// and these two charts are a few dozen lines.
// Every drawn point carries its data (data-t, data-v) so a test can check
// the picture against the daemon's own samples.

const NS = 'http://www.w3.org/2000/svg';
const W = 560;
const H = 160;
const PAD = { l: 56, r: 10, t: 10, b: 22 };

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hour12: false });

// lineChart draws series over time into svg (an <svg> made by chartSVG).
// series: [{ name, cls, points: [[unixSeconds, value], ...] }]; opts: { max
// (the y axis' top; default the data's), fmt (a value as text), span (the
// window in seconds the x axis covers, ending at the newest point) }.
export function lineChart(svg, series, opts = {}) {
  const fmt = opts.fmt || String;
  const all = series.flatMap((x) => x.points);
  svg.replaceChildren();
  const iw = W - PAD.l - PAD.r;
  const ih = H - PAD.t - PAD.b;
  svg.dataset.points = String(series[0] ? series[0].points.length : 0);
  if (all.length === 0) {
    svg.append(s('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty' }, 'no samples yet'));
    return;
  }
  const tMax = Math.max(...all.map((p) => p[0]));
  const tMin = opts.span ? tMax - opts.span : Math.min(...all.map((p) => p[0]));
  const yMax = opts.max || Math.max(1, ...all.map((p) => p[1])) * 1.1;
  const x = (t) => PAD.l + (tMax === tMin ? iw : ((t - tMin) / (tMax - tMin)) * iw);
  const y = (v) => PAD.t + ih - (Math.min(v, yMax) / yMax) * ih;
  for (const f of [0, 0.5, 1]) {
    svg.append(s('line', { x1: PAD.l, x2: W - PAD.r, y1: y(yMax * f), y2: y(yMax * f), class: 'grid' }),
      s('text', { x: PAD.l - 6, y: y(yMax * f) + 4, 'text-anchor': 'end', class: 'axis' }, fmt(yMax * f)));
  }
  svg.append(s('text', { x: PAD.l, y: H - 6, class: 'axis' }, clock(tMin)),
    s('text', { x: W - PAD.r, y: H - 6, 'text-anchor': 'end', class: 'axis' }, clock(tMax)));
  for (const ser of series) {
    const pts = ser.points.filter((p) => p[0] >= tMin);
    const line = s('polyline', { class: `series ${ser.cls || ''}`, points: pts.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' ') });
    line.dataset.series = ser.name;
    svg.append(line);
    const g = s('g', { class: `dots ${ser.cls || ''}` });
    g.dataset.series = ser.name;
    for (const p of pts) {
      const c = s('circle', { cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 1.8 }, s('title', {}, `${clock(p[0])}: ${fmt(p[1])}`));
      c.dataset.t = String(p[0]);
      c.dataset.v = String(p[1]);
      g.append(c);
    }
    svg.append(g);
  }
}

// barChart draws one bar per value (oldest first), start being the Unix
// time of the first bar's period and step the period in seconds.
export function barChart(svg, values, start, step, fmt = String) {
  svg.replaceChildren();
  const iw = W - PAD.l - PAD.r;
  const ih = H - PAD.t - PAD.b;
  const yMax = Math.max(1, ...values);
  const bw = iw / Math.max(1, values.length);
  svg.dataset.points = String(values.length);
  for (const f of [0, 1]) {
    const yy = PAD.t + ih - f * ih;
    svg.append(s('line', { x1: PAD.l, x2: W - PAD.r, y1: yy, y2: yy, class: 'grid' }),
      s('text', { x: PAD.l - 6, y: yy + 4, 'text-anchor': 'end', class: 'axis' }, fmt(yMax * f)));
  }
  values.forEach((v, i) => {
    const bh = (v / yMax) * ih;
    const r = s('rect', { x: (PAD.l + i * bw + 0.5).toFixed(1), y: (PAD.t + ih - bh).toFixed(1), width: Math.max(1, bw - 1).toFixed(1), height: bh.toFixed(1), class: 'bar' },
      s('title', {}, `${clock(start + i * step)}: ${fmt(v)}`));
    r.dataset.t = String(start + i * step);
    r.dataset.v = String(v);
    svg.append(r);
  });
  svg.append(s('text', { x: PAD.l, y: H - 6, class: 'axis' }, clock(start)),
    s('text', { x: W - PAD.r, y: H - 6, 'text-anchor': 'end', class: 'axis' }, clock(start + (values.length - 1) * step)));
}

// chartSVG makes an empty chart of the size the functions above draw.
export function chartSVG(id, label) {
  return s('svg', { id, class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label, preserveAspectRatio: 'none' });
}

// meter is a horizontal bar of parts of a whole: parts [{ label, value,
// cls }], total the whole; each part a <div> with data-value.
export function meter(id, parts, total, fmt = String) {
  const el = document.createElement('div');
  el.className = 'meter';
  el.id = id;
  const sum = parts.reduce((a, p) => a + p.value, 0);
  const whole = Math.max(total || 0, sum, 1);
  const bar = document.createElement('div');
  bar.className = 'meter-bar';
  const legend = document.createElement('div');
  legend.className = 'meter-legend';
  for (const p of parts) {
    const seg = document.createElement('div');
    seg.className = `seg ${p.cls || ''}`;
    seg.style.width = `${(100 * p.value) / whole}%`;
    seg.dataset.value = String(p.value);
    seg.dataset.part = p.label;
    seg.title = `${p.label}: ${fmt(p.value)}`;
    bar.append(seg);
    const li = document.createElement('span');
    li.className = `key ${p.cls || ''}`;
    li.textContent = `${p.label}: ${fmt(p.value)}`;
    legend.append(li);
  }
  if (total) {
    const li = document.createElement('span');
    li.className = 'key total';
    li.textContent = `of ${fmt(total)}`;
    legend.append(li);
  }
  el.append(bar, legend);
  return el;
}
