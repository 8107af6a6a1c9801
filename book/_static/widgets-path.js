// Loaded before require.js and the ipywidgets HTML manager: point both at the copy this site serves
// (_static/vendor/html-manager/), so the manager's fonts and modules never come from a CDN.
(function () {
  var base = new URL("vendor/html-manager/", document.currentScript.src).href;
  window.__jupyter_widgets_assets_path__ = base;
  window.require = { paths: { "@jupyter-widgets/html-manager/dist": base.replace(/\/$/, "") } };
})();
