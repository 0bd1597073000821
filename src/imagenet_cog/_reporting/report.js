// The HTML report's own script: sortable tables and the concept explorer. The page reads in
// full without it; it fetches nothing.
"use strict";

(function () {
  // ------------------------------------------------------------ sortable tables
  function cellValue(row, index) {
    const cell = row.cells[index];
    if (!cell) return null;
    const raw = cell.getAttribute("data-sort");
    if (raw !== null) {
      const number = parseFloat(raw);
      return Number.isNaN(number) ? raw.toLowerCase() : number;
    }
    return cell.textContent.trim().toLowerCase();
  }

  function compare(a, b) {
    // Missing values (null, "") sort last whatever the direction.
    if (a === null || a === "") return b === null || b === "" ? 0 : 1;
    if (b === null || b === "") return -1;
    if (typeof a === "number" && typeof b === "number") return a - b;
    return String(a).localeCompare(String(b));
  }

  function sortBy(table, th) {
    const index = Array.prototype.indexOf.call(th.parentNode.children, th);
    const ascending = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th[aria-sort]").forEach(function (other) {
      other.removeAttribute("aria-sort");
    });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const body = table.tBodies[0];
    const rows = Array.prototype.slice.call(body.rows);
    const keyed = rows.map(function (row, i) {
      return { row: row, key: cellValue(row, index), i: i };
    });
    keyed.sort(function (x, y) {
      const missing = x.key === null || x.key === "" || y.key === null || y.key === "";
      const order = compare(x.key, y.key);
      return (missing || ascending ? order : -order) || x.i - y.i;
    });
    const fragment = document.createDocumentFragment();
    keyed.forEach(function (k) { fragment.appendChild(k.row); });
    body.appendChild(fragment);
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (th) {
      th.setAttribute("data-sortable", "");
      th.setAttribute("title", "sort by this column");
      th.addEventListener("click", function () { sortBy(table, th); });
    });
  });

  // ------------------------------------------------------------ the concept explorer
  const table = document.getElementById("concepts-table");
  if (!table) return;
  const search = document.getElementById("concept-search");
  const level = document.getElementById("concept-level");
  const modelA = document.getElementById("model-a");
  const modelB = document.getElementById("model-b");
  const count = document.getElementById("concept-count");
  const rows = Array.prototype.slice.call(table.tBodies[0].rows);
  const total = rows.length;

  function filter() {
    const words = search.value.trim().toLowerCase();
    const wanted = level.value;
    let shown = 0;
    rows.forEach(function (row) {
      const text = row.getAttribute("data-search");
      const visible =
        (!words || text.indexOf(words) !== -1) &&
        (!wanted || row.getAttribute("data-level") === wanted);
      row.hidden = !visible;
      if (visible) shown += 1;
    });
    count.textContent = shown + " of " + total + " concepts";
  }

  function difference() {
    if (!modelA || !modelB) return;
    // Models by their index: a name may hold any character, an attribute name may not.
    const a = modelA.value;
    const b = modelB.value;
    const names = [modelA, modelB].map(function (select) {
      return select.options[select.selectedIndex].textContent;
    });
    // A break allowed after each underscore, as the page's own cells allow it.
    document.getElementById("diff-head").textContent = (names[0] + " \u2212 " + names[1])
      .replace(/_/g, "_\u200b");
    rows.forEach(function (row) {
      const cell = row.querySelector("td.diff");
      const x = parseFloat(row.getAttribute("data-acc-" + a));
      const y = parseFloat(row.getAttribute("data-acc-" + b));
      if (Number.isNaN(x) || Number.isNaN(y)) {
        cell.textContent = "-";
        cell.setAttribute("data-sort", "");
        cell.className = "diff";
        return;
      }
      const d = x - y;
      cell.textContent = (d > 0 ? "+" : d < 0 ? "\u2212" : "") + Math.abs(d).toFixed(1);
      cell.setAttribute("data-sort", d.toFixed(4));
      cell.className = "diff " + (d > 0 ? "pos" : d < 0 ? "neg" : "");
    });
  }

  search.addEventListener("input", filter);
  level.addEventListener("change", filter);
  if (modelA && modelB) {
    modelA.addEventListener("change", difference);
    modelB.addEventListener("change", difference);
  }
  filter();
})();
