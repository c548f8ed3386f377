// Activity charts: draws each <figure data-chart> of a [data-activity-src] block with uPlot
// from the console's JSON series. The tables in the page hold the same numbers; once a chart
// is drawn its table folds away (still one click away). Without JS the tables are the page.
(function () {
  "use strict";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];

  // What is drawn: [figure, chart, times, plot]. Redrawn when the OS switches light/dark
  // (the axes and grid take the page's colours when drawn), resized with the window.
  var drawn = [];

  function draw(figure, chart, times) {
    var target = figure.querySelector(".chart-canvas");
    if (!target || !chart.series.length) {
      figure.setAttribute("data-drawn", "empty");
      return null;
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
    figure.setAttribute("data-ink", ink);  // the axes' colour, as drawn
    var details = figure.querySelector("details.chart-numbers");
    if (details) details.open = false;
    return plot;
  }

  function redrawAll() {
    drawn.forEach(function (entry) {
      entry[3].destroy();
      entry[3] = draw(entry[0], entry[1], entry[2]);
    });
  }

  window.addEventListener("resize", function () {
    drawn.forEach(function (entry) {
      var target = entry[0].querySelector(".chart-canvas");
      entry[3].setSize({ width: Math.max(target.clientWidth || 320, 240), height: 180 });
    });
  });
  if (window.matchMedia) {
    var scheme = window.matchMedia("(prefers-color-scheme: dark)");
    if (scheme.addEventListener) scheme.addEventListener("change", redrawAll);
    else if (scheme.addListener) scheme.addListener(redrawAll);
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
          var plot = chart ? draw(figure, chart, payload.times) : null;
          if (plot) drawn.push([figure, chart, payload.times, plot]);
        });
      })
      .catch(function () { /* the tables stay open: the same numbers */ });
  }

  function start() { document.querySelectorAll("[data-activity-src]").forEach(load); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
