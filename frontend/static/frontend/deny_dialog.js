// Ask for the reason of a denial in a modal dialog; resolves to the reason or null.

export function askDenyReason(tool) {
  const dialog = document.getElementById("deny-dialog");
  const reason = document.getElementById("deny-reason");
  const error = document.getElementById("deny-error");
  document.getElementById("deny-tool").textContent = tool;
  reason.value = "";
  error.textContent = "";
  reason.removeAttribute("aria-invalid");
  return new Promise((resolve) => {
    const form = document.getElementById("deny-form");
    const cancel = document.getElementById("deny-cancel");
    const finish = (value) => {
      form.removeEventListener("submit", onSubmit);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("cancel", onCancel);
      if (dialog.open) dialog.close();
      resolve(value);
    };
    const onSubmit = (event) => {
      event.preventDefault();
      const text = reason.value.trim();
      if (!text) {
        error.textContent = "Say why, so the agent and the audit log know.";
        reason.setAttribute("aria-invalid", "true");
        reason.focus();
        return;
      }
      finish(text);
    };
    const onCancel = (event) => { event.preventDefault(); finish(null); };
    // Enter sends the reason (Shift+Enter for a new line): decide from the keyboard.
    reason.onkeydown = (event) => {
      if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); form.requestSubmit(); }
    };
    form.addEventListener("submit", onSubmit);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    reason.focus();
  });
}
