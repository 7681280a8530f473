// The review page's behaviour: the split/unified toggle, following links to files and lines, and
// jumping between warnings. The page reads fine without it (split view, plain anchors).
//
// State in the address, so a link can open the page as someone else saw it (and a test can too):
//   ?view=unified        the view (also remembered in this browser once toggled; without
//                        either, split, or unified in a narrow window)
//   #file-3              a file, as the file list links to it
//   #f3-L47              line 47 of the original of file 3 (in either view; clicking a number
//                        on the left side puts it in the address)
"use strict";

(function () {
  const errors = document.getElementById("page-errors");
  function report(message) {
    errors.hidden = false;
    errors.textContent += message + "\n";
    document.body.dataset.errors = String(Number(document.body.dataset.errors || 0) + 1);
  }
  window.addEventListener("error", (event) => report("error: " + event.message));
  window.addEventListener("unhandledrejection", (event) => report("rejection: " + event.reason));

  const VIEWS = ["split", "unified"];
  const KEY = "npu-migrate-review-view";

  function remembered() {
    try {
      return window.localStorage.getItem(KEY);
    } catch (e) {
      return null; // storage can be refused for file:// pages; the toggle still works
    }
  }

  function setView(view, remember) {
    if (!VIEWS.includes(view)) return;
    document.body.dataset.view = view;
    for (const button of document.querySelectorAll(".toggle button")) {
      button.setAttribute("aria-pressed", String(button.dataset.view === view));
    }
    if (remember) {
      try {
        window.localStorage.setItem(KEY, view);
      } catch (e) {
        // not remembered: nothing else depends on it
      }
    }
  }

  // The table of a file in the view on screen (a file without changes has one for both views).
  function shownTable(section) {
    return section.querySelector("table." + document.body.dataset.view + ", table.single");
  }

  // The row of old line N of file F on screen.
  function lineRow(file, line) {
    const section = document.getElementById("file-" + file);
    const table = section && shownTable(section);
    if (!table) return null;
    const cells = table.querySelectorAll("td.num:first-child[data-n='" + line + "']");
    return cells.length ? cells[0].parentElement : null;
  }

  function markCurrent(fileId) {
    for (const section of document.querySelectorAll("details.file.current")) {
      section.classList.remove("current");
    }
    for (const link of document.querySelectorAll(".file-list a[aria-current]")) {
      link.removeAttribute("aria-current");
    }
    const section = fileId && document.getElementById(fileId);
    if (!section) return;
    section.classList.add("current");
    const link = document.querySelector(".file-list a[href='#" + fileId + "']");
    if (link) link.setAttribute("aria-current", "true");
  }

  function follow(scroll) {
    const hash = decodeURIComponent(window.location.hash.slice(1));
    const line = /^f(\d+)-L(\d+)$/.exec(hash);
    for (const row of document.querySelectorAll("tr.target")) row.classList.remove("target");
    if (line) {
      const row = lineRow(line[1], line[2]);
      if (row) {
        row.closest("details.file").open = true;
        row.classList.add("target");
        if (scroll) row.scrollIntoView({ block: "center" });
      }
      markCurrent("file-" + line[1]);
      return;
    }
    const target = hash && document.getElementById(hash);
    if (target && target.matches("details")) target.open = true;
    markCurrent(/^file-\d+$/.test(hash) ? hash : null);
  }

  function nextWarning() {
    const notes = [];
    for (const section of document.querySelectorAll("details.file")) {
      const table = shownTable(section);
      const places = section.querySelectorAll(".loose-notes .note.warning");
      notes.push(...places, ...(table ? table.querySelectorAll(".note.warning") : []));
    }
    if (!notes.length) return;
    const current = document.querySelector(".note.focus");
    let index = current ? notes.indexOf(current) + 1 : 0;
    if (index >= notes.length) index = 0;
    if (current) current.classList.remove("focus");
    const note = notes[index];
    note.closest("details.file").open = true;
    note.classList.add("focus");
    note.scrollIntoView({ block: "center" });
    markCurrent(note.closest("details.file").id);
  }

  const asked = new URLSearchParams(window.location.search).get("view");
  // Without a choice, a narrow window gets the unified view: two code columns would not fit.
  const fallback = window.innerWidth < 900 ? "unified" : "split";
  setView(VIEWS.includes(asked) ? asked : remembered() || fallback, false);
  for (const button of document.querySelectorAll(".toggle button")) {
    button.addEventListener("click", () => {
      setView(button.dataset.view, true);
      follow(true);
    });
  }
  const next = document.getElementById("next-warning");
  next.addEventListener("click", nextWarning);
  next.disabled = !document.querySelector(".note.warning");
  document.addEventListener("keydown", (event) => {
    if (event.target.closest("input, textarea") || event.ctrlKey || event.metaKey) return;
    if (event.key === "n") nextWarning();
  });
  window.addEventListener("hashchange", () => follow(true));
  document.addEventListener("click", (event) => {
    const cell = event.target.closest("td.num[data-n]");
    if (!cell || cell !== cell.parentElement.querySelector("td.num")) return;
    const section = cell.closest("details.file");
    history.replaceState(null, "", "#f" + section.id.slice(5) + "-L" + cell.dataset.n);
    follow(false);
  });

  follow(true);
  document.body.dataset.ready = "true";
})();
