// Keeps each page live: every few seconds the page's own URL is fetched again with an
// X-Limitd-Live header, and the server answers with the page's live part only, which
// replaces #live. No refresh while the user is typing in it or has rows selected, so a
// refresh never throws away what they were doing.
(function () {
  "use strict";
  const seconds = parseFloat(document.body.dataset.refresh || "2");
  const live = document.getElementById("live");
  const dot = document.querySelector(".live-dot");

  function busy() {
    const active = document.activeElement;
    if (active && live.contains(active) && active.matches("input, select, textarea")) return true;
    return live.querySelector("input[type=checkbox]:checked") !== null;
  }

  async function refresh() {
    if (!live || document.hidden || busy()) return;
    try {
      const response = await fetch(window.location.href, { headers: { "X-Limitd-Live": "1" }, credentials: "same-origin" });
      if (!response.ok) throw new Error(response.status);
      const html = await response.text();
      if (busy()) return;  // the user started typing or ticked a box meanwhile
      live.innerHTML = html;
      if (dot) { dot.classList.remove("off"); dot.classList.add("on"); setTimeout(() => dot.classList.remove("on"), 300); }
      document.dispatchEvent(new CustomEvent("limitd:refreshed"));
    } catch (error) {
      if (dot) dot.classList.add("off");
    }
  }

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });

  // "select all" boxes: a checkbox with data-select-all="NAME" toggles every box named NAME.
  document.addEventListener("change", function (event) {
    const box = event.target;
    if (!box.dataset || !box.dataset.selectAll) return;
    document.querySelectorAll('input[name="' + box.dataset.selectAll + '"]').forEach(function (other) { other.checked = box.checked; });
  });

  if (seconds > 0) setInterval(refresh, seconds * 1000);
})();
