// What the jobs and runs views share: a list filtered by the address
// (#/<view>?<filter>=...), read a page at a time with "More", and a
// detail panel for the row the address selects.

import { h, clear } from "./dom.js";
import { toast } from "./dialog.js";

const PAGE = 100;

// filters makes a view's filter controls, data-test "<view>-filter-<name>".
// A change navigates (go) with the filter set and the selection (the sel
// parameter) cleared, since the selected item may no longer be listed.
export function filters(view, sel, go) {
  const controls = {};
  const control = (name, text, el) => h("label", {}, text, (controls[name] = el));
  return {
    select: (name, text, options) => control(name, text,
      h("select", { name, "data-test": `${view}-filter-${name}`, onchange: (e) => go({ [name]: e.target.value, [sel]: "" }) },
        options.map(([v, t]) => h("option", { value: v, text: t })))),
    input: (name, text, placeholder) => control(name, text,
      h("input", { name, "data-test": `${view}-filter-${name}`, placeholder, onchange: (e) => go({ [name]: e.target.value.trim(), [sel]: "" }) })),
    // sync shows the filters of p, which the back button changes too; a
    // value a select does not offer (a class or status it does not know)
    // is added to it.
    sync(p) {
      for (const [k, el] of Object.entries(controls)) {
        const v = p[k] || "";
        if (el.tagName === "SELECT" && ![...el.options].some((o) => o.value === v)) el.appendChild(h("option", { value: v, text: v }));
        el.value = v;
      }
    },
    // moved shows the filters of the address parameters next and reports
    // whether the list they select differs from prev's: a filter of keys
    // or the page size changed.
    moved(keys, next, prev) {
      this.sync(next);
      return changed([...keys, "limit"], next, prev);
    },
  };
}

// options are a filter's choices: any (the value ""), then given (pairs
// of value and text), then each of values as itself.
export function options(any, values, given = []) {
  return [["", any], ...given, ...values.map((v) => [v, v])];
}

// panel is a view's list: its filter controls and the count, the table of
// columns over tbody, and the "More" button of pages (data-test
// "<view>-list").
export function panel(view, pages, columns, tbody, ...controls) {
  return h("section", { class: "panel", "data-test": `${view}-list` },
    h("div", { class: "filters" }, ...controls, pages.count),
    h("div", { class: "table-wrap" }, h("table", {}, head(columns), tbody)),
    h("div", { class: "panel-body", style: { "text-align": "center" } }, pages.more));
}

// pages reads a list a page at a time: size() rows (?limit= of the
// address, else 100, at most max, the API's bound), then "More" (the
// button more, data-test "<view>-more") the next ones. fetch(limit,
// cursor) answers { rows, next_cursor }; shown(rows) draws them, and
// count says how many, in noun ("job") and its plural.
export function pages({ view, noun, max, limit, fetch, shown }) {
  const size = () => Math.min(Math.max(Number(limit()) || PAGE, 1), max);
  const count = h("span", { class: "count", "data-test": `${view}-count` });
  const more = h("button", { class: "small", "data-test": `${view}-more`, hidden: true, text: "More", onclick: () => load(true).catch((e) => toast(e.message, true)) });
  let rows = [];
  let cursor = "";

  // Loads run one after another, so the last one asked for is the one
  // shown: a filter changed twice, "More" during a refresh.
  let loading = Promise.resolve();
  function load(append = false) {
    const next = loading.then(() => loadPage(append));
    loading = next.catch(() => {});
    return next;
  }

  async function loadPage(append) {
    // A refresh reads as many rows as are shown, so the pages "More"
    // added stay (up to max).
    const n = append ? size() : Math.min(Math.max(rows.length, size()), max);
    const page = await fetch(n, append ? cursor : "");
    rows = append ? rows.concat(page.rows) : page.rows;
    cursor = page.next_cursor || "";
    more.hidden = !cursor;
    count.textContent = `${rows.length}${cursor ? "+" : ""} ${rows.length === 1 ? noun : noun + "s"}`;
    shown(rows);
  }

  return {
    count, more, load,
    rows: () => rows,
    // reset forgets the rows shown, for a list whose filters changed.
    reset() { rows = []; },
  };
}

// changed reports whether any of keys differs between two sets of address
// parameters, a missing one counting as "".
export function changed(keys, a, b) {
  return keys.some((k) => (a[k] || "") !== (b[k] || ""));
}

export function head(columns) {
  return h("thead", {}, h("tr", {}, columns.map((t) => h("th", { text: t }))));
}

// drawRows fills tbody with row(item, now) for each item, or a line
// saying empty across the columns.
export function drawRows(tbody, items, columns, empty, row) {
  clear(tbody);
  if (!items.length) {
    tbody.appendChild(h("tr", {}, h("td", { colspan: columns.length, class: "empty", text: empty })));
    return;
  }
  const now = Date.now();
  for (const it of items) tbody.appendChild(row(it, now));
}

// idCell is a list's id column: the first keep characters of id (one at
// most two longer shows whole), the full id as its title.
export function idCell(id, keep) {
  return h("td", { class: "id", title: id, text: id.length > keep + 2 ? id.slice(0, keep) + "…" : id });
}

// itemRow is a list row that selects its item (it.id) when clicked.
export function itemRow(it, selected, select, ...cells) {
  return h("tr", { class: `clickable${selected === it.id ? " selected" : ""}`, "data-id": it.id, "data-status": it.status,
    onclick: () => select(it.id) }, ...cells);
}

// loadDetail shows the selected item (id(), read again after the fetch as
// the address may have moved on) in panel beside the list of layout, or
// hides the panel when none is selected. get fetches it; a 404 says
// "No <noun> <id>.".
export async function loadDetail(layout, panel, noun, id, get, draw) {
  layout.classList.toggle("with-detail", !!id());
  panel.hidden = !id();
  if (!id()) return;
  let view;
  try {
    view = await get(id());
  } catch (e) {
    clear(panel).appendChild(h("div", { class: "panel-body" }, h("p", { class: "err", text: e.status === 404 ? `No ${noun} ${id()}.` : e.message })));
    return;
  }
  draw(view);
}

// kv is a fact of a detail panel; test, when given, is the value's
// data-test.
export function kv(k, v, test) {
  return [h("dt", { text: k }), h("dd", { text: v, "data-test": test })];
}

// lastError is an item's last error: its class and message, as far as
// known.
export function lastError(x) {
  return [x.last_error_class, x.last_error_message].filter(Boolean).join(": ");
}

// retriesUsed says how much of an item's retry budget is used. A manual
// retry without a reset may go past the budget; "3 of 2" would read as a
// counting error.
export function retriesUsed(x) {
  if (x.max_retries === null || x.max_retries === undefined) return String(x.retry_count);
  const used = x.retry_count > x.max_retries ? `${x.retry_count}, over the ${x.max_retries} allowed` : `${x.retry_count} of ${x.max_retries}`;
  return x.retry_enabled ? used : `${used} (retries disabled)`;
}
