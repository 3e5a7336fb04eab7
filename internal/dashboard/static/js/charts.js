// Small hand-written SVG charts: horizontal stacked bars, columns and
// range bars. Sized by viewBox, so they scale with their container.

import { h, s } from "./dom.js";

// stackedBars draws one bar per row, split into parts by key.
// rows: [{label, parts: {key: value}}]; keys: ordered keys with colors.
export function stackedBars(rows, keys, colors, { width = 560, barH = 20, labelW = 140 } = {}) {
  const gap = 8;
  const height = rows.length * (barH + gap) + gap;
  const max = Math.max(1, ...rows.map((r) => keys.reduce((a, k) => a + (r.parts[k] || 0), 0)));
  const plotW = width - labelW - 50;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  rows.forEach((r, i) => {
    const y = gap + i * (barH + gap);
    svg.appendChild(s("text", { x: labelW - 8, y: y + barH / 2 + 4, "text-anchor": "end", text: r.label }));
    let x = labelW, total = 0;
    for (const k of keys) {
      const v = r.parts[k] || 0;
      if (!v) continue;
      const w = (v / max) * plotW;
      const rect = s("rect", { x, y, width: Math.max(w, 1), height: barH, fill: colors[k] || "#9ca3af", rx: 2 });
      rect.appendChild(s("title", { text: `${r.label} · ${k.replaceAll("_", " ")}: ${v}` }));
      svg.appendChild(rect);
      x += w;
      total += v;
    }
    svg.appendChild(s("text", { x: x + 6, y: y + barH / 2 + 4, text: String(total) }));
  });
  return h("div", { class: "chart" }, svg, legend(keys.filter((k) => rows.some((r) => r.parts[k])), colors));
}

// columns draws a histogram: bars [{label, value}].
export function columns(bars, color, { width = 320, height = 130, unit = "" } = {}) {
  const pad = { l: 28, r: 6, t: 14, b: 20 };
  const max = Math.max(1, ...bars.map((b) => b.value));
  const plotW = width - pad.l - pad.r, plotH = height - pad.t - pad.b;
  const bw = plotW / Math.max(bars.length, 1);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  svg.appendChild(s("line", { class: "axis", x1: pad.l, x2: width - pad.r, y1: pad.t + plotH, y2: pad.t + plotH }));
  svg.appendChild(s("text", { x: pad.l - 4, y: pad.t + 4, "text-anchor": "end", text: String(max) }));
  bars.forEach((b, i) => {
    const bh = (b.value / max) * plotH;
    const w = Math.min(bw * 0.7, 44);
    const x = pad.l + i * bw + (bw - w) / 2;
    const rect = s("rect", { x, y: pad.t + plotH - bh, width: w, height: Math.max(bh, b.value ? 1 : 0), fill: color, rx: 2 });
    rect.appendChild(s("title", { text: `${b.label}${unit}: ${b.value}` }));
    svg.appendChild(rect);
    svg.appendChild(s("text", { x: x + w / 2, y: height - 6, "text-anchor": "middle", text: b.label }));
  });
  return h("div", { class: "chart" }, svg);
}

// ranges draws one bar per step from lo to hi on a shared time axis
// (milliseconds); used for the policy schedule preview.
export function ranges(steps, fmt, { width = 560, barH = 14 } = {}) {
  const gap = 6, labelW = 70;
  const height = steps.length * (barH + gap) + gap + 16;
  const max = Math.max(1, ...steps.map((st) => st.hi));
  const plotW = width - labelW - 90;
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  steps.forEach((st, i) => {
    const y = gap + i * (barH + gap);
    svg.appendChild(s("text", { x: labelW - 8, y: y + barH - 2, "text-anchor": "end", text: st.label }));
    const x0 = labelW + (st.lo / max) * plotW, x1 = labelW + (st.hi / max) * plotW;
    svg.appendChild(s("rect", { x: labelW, y: y + barH / 2 - 1, width: Math.max(x0 - labelW, 0), height: 2, fill: "#cbd5e1" }));
    const rect = s("rect", { x: x0, y, width: Math.max(x1 - x0, 2), height: barH, fill: "#2563eb", rx: 2, opacity: 0.85 });
    rect.appendChild(s("title", { text: `${st.label}: ${fmt(st.lo)} – ${fmt(st.hi)} after the first failure` }));
    svg.appendChild(rect);
    svg.appendChild(s("text", { x: x1 + 6, y: y + barH - 2, text: st.lo === st.hi ? fmt(st.lo) : `${fmt(st.lo)}–${fmt(st.hi)}` }));
  });
  return h("div", { class: "chart" }, svg);
}

export function legend(keys, colors) {
  return h("div", { class: "legend" }, keys.map((k) => h("span", { style: { "--c": colors[k] || "#9ca3af" }, text: k.replaceAll("_", " ") })));
}
