// The Agent-Reach console's only script: live updates over Server-Sent Events, the activity
// feed's pause button, confirmations and "select all". Pages work without it (minus the live part).
(function () {
  "use strict";

  var live = (document.body.dataset.live || "").split(" ").filter(Boolean);
  var dot = document.getElementById("live-dot");
  var feedPaused = false;
  var held = [];
  var FEED_MAX = 200;
  var pause = document.getElementById("feed-pause");

  function swap(id, html) {
    var el = document.getElementById(id);
    if (el) { el.innerHTML = html; }
  }

  function addFeed(html) {
    var el = document.getElementById("feed");
    if (!el) { return; }
    var first = el.querySelector(".placeholder");
    if (first) { first.remove(); }
    el.insertAdjacentHTML("afterbegin", html);
    while (el.children.length > FEED_MAX) { el.lastElementChild.remove(); }
  }

  if (live.length && window.EventSource) {
    var source = new EventSource("/console/live");
    source.onopen = function () { if (dot) { dot.classList.add("on"); } };
    source.onerror = function () { if (dot) { dot.classList.remove("on"); } };
    if (live.indexOf("overview") >= 0) {
      source.addEventListener("overview", function (e) { swap("overview-live", e.data); });
    }
    if (live.indexOf("agents") >= 0) {
      source.addEventListener("agents", function (e) { swap("agents-live", e.data); });
    }
    if (live.indexOf("feed") >= 0) {
      source.addEventListener("feed", function (e) {
        if (!feedPaused) { addFeed(e.data); return; }
        held.push(e.data);
        if (pause) { pause.textContent = "Resume (" + held.length + " waiting)"; }
      });
    }
  }

  if (pause) {
    pause.addEventListener("click", function () {
      feedPaused = !feedPaused;
      pause.textContent = feedPaused ? "Resume (" + held.length + " waiting)" : "Pause";
      if (!feedPaused) { held.forEach(addFeed); held = []; }
    });
  }

  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (e) {
      if (!window.confirm(form.dataset.confirm)) { e.preventDefault(); }
    });
  });

  document.querySelectorAll("[data-check-all]").forEach(function (box) {
    box.addEventListener("change", function () {
      var name = box.dataset.checkAll;
      document.querySelectorAll("input[type=checkbox][name='" + name + "']").forEach(function (b) {
        b.checked = box.checked;
      });
    });
  });
}());
