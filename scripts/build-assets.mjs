// Copies the browser builds of our npm packages into static/vendor/, where Django's
// staticfiles finds them. static/vendor/ is generated and ignored by git.
import { cpSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const vendor = join(root, "static", "vendor");
const files = [
  ["@xterm/xterm/lib/xterm.js", "xterm/xterm.js"],
  ["@xterm/xterm/css/xterm.css", "xterm/xterm.css"],
  ["@xterm/addon-fit/lib/addon-fit.js", "xterm/addon-fit.js"],
  ["@xterm/addon-search/lib/addon-search.js", "xterm/addon-search.js"],
  ["uplot/dist/uPlot.iife.min.js", "uplot/uPlot.iife.min.js"],
  ["uplot/dist/uPlot.min.css", "uplot/uPlot.min.css"],
];

rmSync(vendor, { recursive: true, force: true });
for (const [from, to] of files) {
  const target = join(vendor, to);
  mkdirSync(dirname(target), { recursive: true });
  cpSync(join(root, "node_modules", from), target);
  console.log(`static/vendor/${to}`);
}
