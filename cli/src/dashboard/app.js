// The dashboard's script: refreshes the sections every 5 s (the server renders and escapes
// them), opens the confirmation dialog for a button, and posts its form.
"use strict";

(function () {
  const units = document.getElementById("units");
  const dialog = document.getElementById("confirm");
  const form = document.getElementById("action-form");
  const outcome = document.getElementById("outcome");
  const refreshed = document.getElementById("refreshed");
  let paging = { task: "", from: "" };

  const field = (id) => document.getElementById(id);

  async function refresh() {
    if (dialog.open) {
      return;
    }
    const query = new URLSearchParams(paging);
    const response = await fetch("/fragment?" + query.toString(), { credentials: "same-origin" });
    if (response.ok) {
      units.innerHTML = await response.text();
      refreshed.textContent = "Refreshed at " + new Date().toLocaleTimeString() + ".";
    } else {
      refreshed.textContent = "Refresh failed: HTTP " + response.status + ".";
    }
  }

  const questions = {
    resolve: "Mark this unit done with the result below: every later delivery gets it back instead of running the work. Only if its side effect happened.",
    free: "Free this unit: the next delivery runs the work again, as new. Only if its side effect did not happen.",
    forget: "Forget this unit's result: the next delivery runs the work again.",
    resolve_step: "Record the step in doubt as done with the value below, at the end of the unit's journal, and free the unit: the next delivery replays it and goes on after it. Only if that step's effect happened.",
    discard: "Free this unit and delete its journal of steps: the next delivery runs the whole body as new, and the recorded steps' effects run again. For a unit whose body changed its step order.",
  };

  units.addEventListener("click", (event) => {
    const next = event.target.closest("button.next");
    if (next) {
      paging = { task: next.dataset.task, from: next.dataset.cursor };
      refresh();
      return;
    }
    const button = event.target.closest("button.act");
    if (!button) {
      return;
    }
    const action = button.dataset.action;
    field("confirm-action").value = action;
    field("confirm-task").value = button.dataset.task;
    field("confirm-digest").value = button.dataset.digest;
    field("confirm-key").value = button.dataset.key;
    field("confirm-what").textContent = button.dataset.task + " (digest " + button.dataset.digest + "): " + questions[action];
    const records = action === "resolve" || action === "resolve_step";
    field("confirm-result-label").hidden = !records;
    field("confirm-ttl-label").hidden = !records;
    field("confirm-step-label").hidden = action !== "resolve_step";
    field("confirm-part-label").hidden = action !== "resolve_step";
    dialog.showModal();
  });

  field("confirm-no").addEventListener("click", () => dialog.close());

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = new URLSearchParams(new FormData(form));
    const response = await fetch("/action", { method: "POST", body: body, credentials: "same-origin" });
    let message = "HTTP " + response.status;
    try {
      message = (await response.json()).message;
    } catch (_) {
      // An answer that is not JSON: the status says enough.
    }
    outcome.textContent = message;
    outcome.className = response.ok ? "ok" : "refused";
    dialog.close();
    refresh();
  });

  // The next refresh is due 5 s after the last one ended, so that a slow store never piles
  // refreshes up.
  async function loop() {
    try {
      await refresh();
    } finally {
      setTimeout(loop, 5000);
    }
  }
  setTimeout(loop, 5000);
})();
