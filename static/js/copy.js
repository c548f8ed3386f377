// Copy buttons: <button data-copy="ID"> copies the value (or text) of the element with that id.
// Without JavaScript the field stays a read-only input to select by hand.
document.addEventListener("click", function (event) {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const field = document.getElementById(button.dataset.copy);
  if (!field) return;
  const text = "value" in field ? field.value : field.textContent;
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(function () {
      button.textContent = "Copied";
    });
  } else if (field.select) {
    field.select();
    document.execCommand("copy");
    button.textContent = "Copied";
  }
});
