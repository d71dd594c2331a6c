// On the tutorials, show the source of the functions rendered from the code (mkdocstrings puts it in a
// collapsed "Source code" box): the derivation and the code that implements it belong side by side.
document.addEventListener("DOMContentLoaded", function () {
  if (!window.location.pathname.includes("/tutorials/")) return;
  document.querySelectorAll("details.mkdocstrings-source").forEach(function (box) { box.open = true; });
});
