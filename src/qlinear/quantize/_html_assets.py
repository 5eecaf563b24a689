"""The HTML report's stylesheet and the few lines of script that sort its node table, inlined in every page."""

__all__ = ["SORT_SCRIPT", "STYLE"]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #ddd; text-align: left; }
td { max-width: 36em; overflow-wrap: anywhere; } /* exporters' 80-character node names wrap, the tables fit the page */
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; user-select: none; background: #f4f4f4; }
table.sortable th:after { content: " \\2195"; color: #aaa; }
.decision { background: #e8f6ea; border-left: 4px solid #2e8b40; padding: 0.4em 0.8em; margin: 0.4em 0; }
.warning { background: #fff4e0; border-left: 4px solid #e69500; padding: 0.4em 0.8em; margin: 0.4em 0; }
.bad { color: #b00020; font-weight: 600; } .good { color: #1b7f3b; font-weight: 600; }
code { background: #f4f4f4; padding: 0.1em 0.3em; }
"""

# Sorts the table whose header cell was clicked: numbers as numbers, "exact" above every number, "-" last.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var up = th.dataset.order !== "up"; th.dataset.order = up ? "up" : "down";
      function key(row) {
        var text = row.cells[column].textContent.trim();
        if (text === "exact") return [0, Infinity];
        var n = parseFloat(text);
        return isNaN(n) ? [text === "-" ? 2 : 1, text] : [0, n];
      }
      rows.sort(function (a, b) {
        var ka = key(a), kb = key(b);
        if (ka[0] !== kb[0]) return ka[0] - kb[0];
        var d = ka[1] < kb[1] ? -1 : ka[1] > kb[1] ? 1 : 0;
        return up ? d : -d;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""
