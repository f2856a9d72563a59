// rsched web console: the only script of its pages (CSP script-src 'self').
// Every few seconds, while the tab is visible, it reloads the page's live parts
// (elements with data-live and an id) from the same URL; forms marked
// data-confirm ask first. Content comes from the server escaped; it is parsed
// with DOMParser (whose scripts never run) and moved in as nodes.
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-poll") || "0", 10);

  function refresh() {
    if (document.visibilityState !== "visible") return;
    if (!document.querySelector("[data-live]")) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Rsched-Poll": "1" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (el) {
          var fresh = doc.getElementById(el.id);
          if (fresh) el.replaceWith(document.importNode(fresh, true));
        });
        var stamp = document.getElementById("refreshed");
        if (stamp) stamp.textContent = new Date().toLocaleTimeString();
      })
      .catch(function () {});
  }

  document.addEventListener("submit", function (ev) {
    var f = ev.target;
    var q = f.getAttribute && f.getAttribute("data-confirm");
    if (q && !window.confirm(q)) ev.preventDefault();
  });

  // (also on demand: document.dispatchEvent(new Event("rsched:refresh")))
  document.addEventListener("rsched:refresh", refresh);
  if (every > 0) window.setInterval(refresh, every * 1000);
})();
