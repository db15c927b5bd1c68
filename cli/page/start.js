// start.js: loaded last, once every view has registered.
"use strict";
TK.start().catch((error) => {
  document.getElementById("view").replaceChildren(TK.el("p", {class: "error"}, error.message));
  document.body.dataset.ready = "1";
});
