// The console's one chart: per-second rates as lines, drawn in SVG with
// presentation attributes only (the console's CSP allows no inline style).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLOURS = { enqueued: "#2857d6", delivered: "#2f9e44", retried: "#e67700", failed: "#c92a2a" };

function svgEl(tag, attrs = {}, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// A round number of at least `max`, for the y axis.
function niceCeil(max) {
  if (max <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(max));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((v) => v >= max);
}

// `body` is an answer of /v1/rates or /v1/queues/{q}/rates; `range` is
// "seconds" (the last 5 minutes) or "minutes" (the last hour). Values are
// drawn as rates per second: a minute's count over 60.
function rateChart(body, range) {
  const part = body[range];
  const step = part.stepSeconds;
  const counts = part.counts;
  const last = Date.parse(part.lastStart);
  const width = 720, height = 200, left = 48, right = 8, top = 10, bottom = 24;
  const plotW = width - left - right, plotH = height - top - bottom;
  const rates = body.series.map((_, s) => counts.map((c) => c[s] / step));
  const peak = niceCeil(Math.max(0, ...rates.flat()));
  const x = (i) => left + (counts.length <= 1 ? 0 : (i * plotW) / (counts.length - 1));
  const y = (v) => top + plotH - (v / peak) * plotH;
  const svg = svgEl("svg", {
    viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img",
    "aria-label": `${body.queue || "all queues"}: messages per second over the last ${range === "seconds" ? "5 minutes" : "hour"}`,
    "data-range": range,
  });
  for (let k = 0; k <= 4; k++) {
    const v = (peak * k) / 4;
    svg.append(svgEl("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), stroke: "#e3e6eb" }));
    svg.append(svgEl("text", { x: left - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#5c6678" },
      v >= 100 ? Math.round(v) : Number(v.toFixed(2))));
  }
  for (let k = 0; k <= 4; k++) {
    const i = Math.round((k * (counts.length - 1)) / 4);
    const t = new Date(last - (counts.length - 1 - i) * step * 1000);
    svg.append(svgEl("text", { x: x(i), y: height - 6, "text-anchor": k === 0 ? "start" : k === 4 ? "end" : "middle",
      "font-size": 11, fill: "#5c6678" }, t.toISOString().slice(11, range === "seconds" ? 19 : 16)));
  }
  body.series.forEach((name, s) => {
    const points = rates[s].map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(svgEl("polyline", { points, fill: "none", stroke: COLOURS[name] || "#1d2433",
      "stroke-width": 1.5, "data-series": name }));
  });
  return svg;
}

// The legend: each series' colour and its mean rate over the range.
function rateLegend(body, range) {
  const part = body[range];
  const span = part.counts.length * part.stepSeconds;
  const ul = document.createElement("ul");
  ul.className = "legend";
  body.series.forEach((name, s) => {
    const total = part.counts.reduce((sum, c) => sum + c[s], 0);
    const li = document.createElement("li");
    li.dataset.series = name;
    li.dataset.total = String(total);
    const swatch = svgEl("svg", { width: 12, height: 12, "aria-hidden": "true" },
      svgEl("rect", { width: 12, height: 12, rx: 2, fill: COLOURS[name] }));
    li.append(swatch, ` ${name}: ${total} (${(total / span).toFixed(2)}/s)`);
    ul.append(li);
  });
  return ul;
}
