// The console's only script: it makes pages live and changes nothing else. An element with
// data-live-src and data-live-events fetches its fragment again whenever its event stream
// (Server-Sent Events from `outbox serve`) says something changed; deadlines count down
// (aria-live="off" on them: a screen reader is not told every second).
// Without it every page still works: a reload shows the truth.
"use strict";

function live(section) {
  const src = section.dataset.liveSrc;
  let busy = false;
  let again = false;
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const answer = await fetch(src, { credentials: "same-origin", cache: "no-store" });
      if (answer.ok) {
        // Server-rendered and autoescaped: what a model or tool wrote is text in it.
        section.innerHTML = await answer.text();
        countdowns(section);
      }
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }
  const stream = new EventSource(section.dataset.liveEvents);
  stream.addEventListener("ready", refresh);
  stream.addEventListener("changed", refresh);
  stream.addEventListener("end", () => { stream.close(); refresh(); });
  // The session expired or was signed out: the page again, which leads to the sign-in.
  stream.addEventListener("signed_out", () => { stream.close(); window.location.reload(); });
}

function countdowns(root) {
  for (const time of root.querySelectorAll("time[data-countdown]")) {
    const due = Date.parse(time.getAttribute("datetime"));
    const left = Math.round((due - Date.now()) / 1000);
    time.textContent = left > 0
      ? `in ${Math.floor(left / 60)} min ${left % 60} s (${time.getAttribute("datetime")})`
      : `passed (${time.getAttribute("datetime")})`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const section of document.querySelectorAll("[data-live-src][data-live-events]")) {
    live(section);
  }
  countdowns(document);
  setInterval(() => countdowns(document), 1000);
});
