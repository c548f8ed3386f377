// Forms keep what was typed through an HTMX refresh of themselves. A form that re-renders on
// a change (a config form shows the chosen backend's fields) is swapped while the user may
// still be typing: the server keeps what the request carried, and this keeps what was typed
// after the request left, which the answer could not know. Passwords are never carried over
// (the server never renders a typed secret back either). Pages work without it.
(function () {
  "use strict";

  var SKIPPED = { password: 1, hidden: 1, file: 1, submit: 1, button: 1, reset: 1, image: 1 };
  var saved = null;

  function fields(root) {
    return root.querySelectorAll ? root.querySelectorAll("input[name], select[name], textarea[name]") : [];
  }

  // A request leaves: what is typed from now on is newer than what it carries.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var target = event.detail.target;
    if (!target) { return; }
    fields(target).forEach(function (field) { delete field.dataset.typedLate; });
  });

  document.addEventListener("input", function (event) {
    if (event.target && event.target.name) { event.target.dataset.typedLate = "1"; }
  }, true);
  document.addEventListener("change", function (event) {
    if (event.target && event.target.name) { event.target.dataset.typedLate = "1"; }
  }, true);

  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    saved = null;
    if (!target || !target.id) { return; }
    var late = [];
    fields(target).forEach(function (field) {
      if (field.dataset.typedLate !== "1" || SKIPPED[field.type]) { return; }
      late.push({ name: field.name, value: field.value, checked: field.checked, type: field.type });
    });
    var active = document.activeElement;
    saved = {
      id: target.id,
      late: late,
      focus: active && target.contains(active) && active.name ? active.name : null,
      caret: active && typeof active.selectionStart === "number" ? active.selectionStart : null
    };
  });

  // At once after the swap (before settling, so the field never shows the old value to type
  // over); settling is the fallback for a swap whose event went to an element it removed.
  function restore() {
    if (saved === null) { return; }
    var keep = saved;
    saved = null;
    var root = document.getElementById(keep.id);
    if (!root) { return; }
    keep.late.forEach(function (entry) {
      var selector = "[name=\"" + CSS.escape(entry.name) + "\"]";
      var boxed = entry.type === "checkbox" || entry.type === "radio";
      // Boxes of one name (the sessions list's `session`) are told apart by their value.
      // A box without a value attribute has the value "on".
      var field = boxed
        ? root.querySelector(selector + "[value=\"" + CSS.escape(entry.value) + "\"]") ||
          (entry.value === "on" ? root.querySelector(selector + ":not([value])") : null)
        : root.querySelector(selector);
      if (!field || SKIPPED[field.type]) { return; }
      if (boxed) {
        if (field.type === entry.type) { field.checked = entry.checked; }
      } else if (field.tagName === "SELECT") {
        if (Array.prototype.some.call(field.options, function (o) { return o.value === entry.value; })) {
          field.value = entry.value;
        }
      } else {
        field.value = entry.value;
      }
      field.dataset.typedLate = "1";
    });
    if (keep.focus) {
      var focused = root.querySelector("[name=\"" + CSS.escape(keep.focus) + "\"]");
      if (focused && document.activeElement !== focused) {
        focused.focus();
        if (keep.caret !== null && typeof focused.setSelectionRange === "function") {
          try { focused.setSelectionRange(keep.caret, keep.caret); } catch (e) { /* a number field */ }
        }
      }
    }
  }
  document.addEventListener("htmx:afterSwap", restore);
  document.addEventListener("htmx:afterSettle", restore);
})();
