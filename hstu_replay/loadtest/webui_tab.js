// The "KV-cache hit ratio" tab's charts in Locust's web UI.
//
// Locust draws an extended tab as a table only. While that tab is open, this script keeps a box
// above the table and fills it every two seconds with the charts the server draws from the run's
// report (/hstu/charts: SVG, the same report the table's rows come from).
(function () {
  "use strict";
  var TAB_TITLE = "KV-cache hit ratio";
  var TABLE_MARK = "Achieved from"; // a column title only the tab's table has
  var BOX_ID = "hstu-charts";
  var REFRESH_MS = 2000;
  var loading = false;

  function tabOpen() {
    var tab = document.querySelector('[role="tab"][aria-selected="true"]');
    return tab !== null && tab.textContent.trim() === TAB_TITLE;
  }

  function tabTable() {
    var tables = document.querySelectorAll("table");
    for (var i = 0; i < tables.length; i++) {
      var head = tables[i].querySelector("thead");
      if (head !== null && head.textContent.indexOf(TABLE_MARK) >= 0) return tables[i];
    }
    return null;
  }

  // The box, in place above the tab's table; removed (and null) while the tab is closed.
  function place() {
    var box = document.getElementById(BOX_ID);
    var table = tabOpen() ? tabTable() : null;
    if (table === null) {
      if (box !== null) box.remove();
      return null;
    }
    var anchor = table.parentElement; // the table's container
    if (box === null) {
      box = document.createElement("div");
      box.id = BOX_ID;
      box.style.margin = "8px 0";
    }
    if (box.nextSibling !== anchor) anchor.parentElement.insertBefore(box, anchor);
    return box;
  }

  function refresh() {
    var box = place();
    if (box === null || loading) return;
    loading = true;
    fetch("/hstu/charts", { cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        return response.ok ? response.text() : Promise.reject(new Error("HTTP " + response.status));
      })
      .then(function (fragment) {
        var current = place();
        if (current !== null) current.innerHTML = fragment;
      })
      .catch(function () { /* the next refresh tries again */ })
      .then(function () { loading = false; });
  }

  var shown = false;
  new MutationObserver(function () {
    var open = place() !== null;
    if (open && !shown) refresh(); // at once when the tab opens, then on the timer
    shown = open;
  }).observe(document.body, { childList: true, subtree: true });
  setInterval(refresh, REFRESH_MS);
})();
