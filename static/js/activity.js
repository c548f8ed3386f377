// Activity charts: draws each <figure data-chart> of a [data-activity-src] block with uPlot
// from the console's JSON series. The tables in the page hold the same numbers; once a chart
// is drawn its table folds away (still one click away). Without JS the tables are the page.
(function () {
  "use strict";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];

  function draw(figure, chart, times) {
    var target = figure.querySelector(".chart-canvas");
    if (!target || !chart.series.length) {
      figure.setAttribute("data-drawn", "empty");
      return;
    }
    var data = [times].concat(chart.series.map(function (s) { return s.values; }));
    var series = [{}].concat(chart.series.map(function (s, i) {
      return { label: s.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: false,
               points: { show: times.length <= 30 } };
    }));
    var width = Math.max(target.clientWidth || figure.clientWidth || 320, 240);
    // The page's own colours (light or dark scheme) for the axes and grid.
    var style = window.getComputedStyle(figure);
    var ink = style.color || "#222";
    var line = style.getPropertyValue("--line").trim() || "rgba(128,128,128,.3)";
    var axis = { stroke: ink, grid: { stroke: line }, ticks: { stroke: line } };
    var plot = new window.uPlot({
      width: width,
      height: 180,
      series: series,
      axes: [axis, Object.assign({ label: chart.unit, size: 50 }, axis)],
      scales: { y: { range: function (u, min, max) { return [0, Math.max(max || 0, 1)]; } } },
      legend: { live: true },
    }, data, target);
    figure.setAttribute("data-drawn", "true");
    var details = figure.querySelector("details.chart-numbers");
    if (details) details.open = false;
    window.addEventListener("resize", function () {
      plot.setSize({ width: Math.max(target.clientWidth || 320, 240), height: 180 });
    });
  }

  function load(block) {
    if (!window.uPlot || !window.fetch) return;
    fetch(block.getAttribute("data-activity-src"), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
      .then(function (payload) {
        var byId = {};
        payload.charts.forEach(function (c) { byId[c.id] = c; });
        block.querySelectorAll("figure[data-chart]").forEach(function (figure) {
          var chart = byId[figure.getAttribute("data-chart")];
          if (chart) draw(figure, chart, payload.times);
        });
      })
      .catch(function () { /* the tables stay open: the same numbers */ });
  }

  function start() { document.querySelectorAll("[data-activity-src]").forEach(load); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
