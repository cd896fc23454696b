// The tenant switcher submits on change (a module, not an inline handler: the
// Content-Security-Policy allows no inline script).
const select = document.getElementById("tenant-select");
if (select) select.addEventListener("change", () => select.form.requestSubmit());
