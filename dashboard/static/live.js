// Live progress on a job page: poll /api/jobs/{id}/progress every 2 s while the job may still change.
// Only text is written into the page (textContent), never markup.
(function () {
  "use strict";
  var box = document.getElementById("progress");
  if (!box || box.dataset.live !== "1") return;
  var url = "/api/jobs/" + encodeURIComponent(box.dataset.job) + "/progress";
  var timer = null;

  function render(p) {
    box.dataset.status = p.status;
    var bar = document.getElementById("progress-bar");
    bar.max = Math.max(1, p.total);
    bar.value = p.finished;
    box.querySelector(".finished").textContent = p.finished;
    box.querySelector(".total").textContent = p.total;
    box.querySelector(".job-status").textContent = p.status;
    var list = box.querySelector("ul.counts");
    while (list.firstChild) list.removeChild(list.firstChild);
    Object.keys(p.counts).sort().forEach(function (status) {
      var li = document.createElement("li");
      li.dataset.status = status;
      var word = document.createElement("span");
      word.className = "status st-" + status;
      word.textContent = status;
      var n = document.createElement("span");
      n.className = "n";
      n.textContent = p.counts[status];
      li.appendChild(word);
      li.appendChild(document.createTextNode(" "));
      li.appendChild(n);
      list.appendChild(li);
    });
    var apart = box.querySelector("p.apart");
    // the wording of db.attempt_roles.apart_text, in its role order
    var apartBy = p.apart || {};
    var parts = ["resample", "interactive", "steered"].filter(function (role) { return apartBy[role]; }).map(function (role) {
      var by = apartBy[role];
      var statuses = Object.keys(by).sort().filter(function (s) { return by[s]; }).map(function (s) { return by[s] + " " + s; });
      var n = Object.keys(by).reduce(function (sum, s) { return sum + by[s]; }, 0);
      return n + " " + role + (n > 1 && role === "resample" ? "s" : "") + " (" + statuses.join(", ") + ")";
    });
    apart.hidden = parts.length === 0;
    apart.querySelector(".apart-text").textContent = parts.join("; ");
  }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (p) {
        render(p);
        if (p.status !== "pending" && p.status !== "running") {
          clearInterval(timer);
          box.dataset.live = "0";
          window.location.reload(); // the episode table and the job's status block change too
        }
      })
      .catch(function () { /* a missed poll is retried at the next tick */ });
  }

  timer = setInterval(poll, 2000);
})();
