// Transformer Math Lab: small fixes to the theme and the reading experience (loaded on every page).
(function () {
  "use strict";

  // 1. Sidebar buttons. pydata-sphinx-theme 0.17 binds its menu and outline handlers to the first .primary-toggle /
  // .secondary-toggle in the page (its own header's, which sphinx-book-theme hides), so the visible buttons of the
  // article header did nothing (pydata-sphinx-theme issue #2451). Here a visible button either folds the sidebar
  // away (when it is shown beside the article, on wide screens) or forwards the click to the theme's bound
  // button, which opens the sidebar as a dialog (narrow screens).
  function onToggleClick(event) {
    var which = ["primary", "secondary"].find(function (w) { return event.target.closest("." + w + "-toggle"); });
    if (!which) return;
    var bound = document.querySelector("." + which + "-toggle");
    var clicked = event.target.closest("." + which + "-toggle");
    if (clicked === bound) return;
    event.preventDefault();
    event.stopPropagation();
    var sidebar = document.getElementById("pst-" + which + "-sidebar");
    var box = sidebar ? sidebar.getBoundingClientRect() : null;  // off-canvas (beside the page) on phones
    var inline = box && sidebar.parentElement.tagName !== "DIALOG" && box.width > 0 && box.right > 0 &&
      box.left < window.innerWidth && getComputedStyle(sidebar).visibility !== "hidden";
    if (inline || document.body.classList.contains("tl-hide-" + which)) {
      document.body.classList.toggle("tl-hide-" + which);
      clicked.setAttribute("aria-expanded", String(!document.body.classList.contains("tl-hide-" + which)));
    } else if (bound) {
      bound.click();
    }
  }
  document.addEventListener("click", onToggleClick, true);

  // 2. Wide inline math and HTML outputs: one wider than the column scrolls inside its own box, with a shadow at
  // the edge that still has content (the "tl-scroll" class in book.css; display math scrolls by CSS alone).
  // Marked after MathJax typesets and on resize.
  function markWide() {
    document.querySelectorAll("article span.math, article .cell_output .output.text_html").forEach(function (box) {
      box.classList.toggle("tl-scroll", box.scrollWidth > box.clientWidth + 1 &&
        Array.prototype.some.call(box.querySelectorAll("mjx-math, pre"), function (m) {
          return m.getBoundingClientRect().right > box.getBoundingClientRect().right + 1;
        }));
    });
  }

  // 3. Long listings printed by show_source (more than FOLD_LINES lines) are folded behind a button; the first
  // lines stay visible. Short excerpts stay open.
  var FOLD_LINES = 25;
  function foldListings() {
    document.querySelectorAll(".cell").forEach(function (cell) {
      var source = cell.querySelector(".cell_input pre");
      if (!source || source.textContent.indexOf("show_source(") < 0) return;
      cell.querySelectorAll(".cell_output .output.stream").forEach(function (out) {
        var pre = out.querySelector("pre");
        var n = pre ? pre.textContent.replace(/\n+$/, "").split("\n").length : 0;
        if (n <= FOLD_LINES || out.classList.contains("tl-folded")) return;
        out.classList.add("tl-folded");
        var button = document.createElement("button");
        button.type = "button";
        button.className = "tl-fold-button";
        var label = function () {
          button.textContent = out.classList.contains("tl-folded") ? "Show all " + n + " lines" : "Fold the listing";
          button.setAttribute("aria-expanded", String(!out.classList.contains("tl-folded")));
        };
        button.addEventListener("click", function () { out.classList.toggle("tl-folded"); label(); });
        label();
        out.after(button);
      });
    });
  }

  // 4. Search snippets: the text of a result page, without its formulas' TeX source.
  function cleanSearchSnippets() {
    // searchtools.js declares `const Search`: a global binding, not a property of window
    if (typeof Search === "undefined" || !Search.htmlToText || Search.tlPatched) return;
    var original = Search.htmlToText;
    Search.htmlToText = function (htmlString, anchor) {
      var doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll(".math").forEach(function (m) { m.replaceWith("…"); });
      return original(doc.documentElement.outerHTML, anchor);
    };
    Search.tlPatched = true;
  }

  // 5. The outline ("On this page") lights the section being read: the last one whose heading is above the top
  // third of the window. pydata-sphinx-theme lights a heading only while it crosses a band at the top of the
  // window, so a long section, a jump or a fast scroll left the wrong entry lit, or none. Run after the theme's
  // own observer has fired, so that its choice does not stay.
  function lightOutline() {
    var nav = document.getElementById("pst-page-toc-nav");
    if (!nav) return;
    var links = Array.prototype.slice.call(nav.querySelectorAll("a.nav-link"));
    var line = window.innerHeight / 3, current = null;
    links.forEach(function (a) {
      var target = document.getElementById(decodeURIComponent(a.hash.slice(1)));
      if (target && target.getBoundingClientRect().top <= line) current = a;
    });
    links.forEach(function (a) {
      a.classList.toggle("active", a === current);
      if (a === current) a.setAttribute("aria-current", "true"); else a.removeAttribute("aria-current");
    });
    nav.querySelectorAll(".toc-entry").forEach(function (entry) {
      entry.classList.toggle("active", !!current && entry.contains(current));
    });
  }
  var outlineTimer;
  window.addEventListener("scroll", function () {
    clearTimeout(outlineTimer);
    outlineTimer = setTimeout(lightOutline, 100);
  }, { passive: true });
  window.addEventListener("load", lightOutline);

  function ready() {
    foldListings();
    cleanSearchSnippets();
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(markWide);
    } else {
      markWide();
    }
    var timer;
    window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(markWide, 200); });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready);
  else ready();
  // MathJax is loaded with defer; it may not exist yet at DOMContentLoaded
  window.addEventListener("load", function () {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) MathJax.startup.promise.then(markWide);
  });
})();
