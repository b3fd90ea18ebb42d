// The create form: GPU models that cannot run the chosen template are shown disabled with the
// reason (the server marks each option with data-refused-TEMPLATE="reason").
(function () {
  "use strict";
  const gpu = document.getElementById("gpu-model");
  const templates = document.getElementById("template"); // the fieldset of radio buttons
  const note = document.getElementById("template-note");
  if (!gpu || !templates) return;
  const offered = new Map(); // option -> disabled by the server (not offered at all)
  for (const option of gpu.options) offered.set(option, option.disabled);

  function attr(name) {
    return "data-refused-" + name.toLowerCase().replace(/[_.]/g, "-");
  }

  function chosen() {
    const checked = templates.querySelector('input[name="template"]:checked');
    return checked ? checked.value : "";
  }

  function update() {
    const template = chosen();
    const key = attr(template);
    let refusedChosen = "";
    for (const option of gpu.options) {
      const reason = option.getAttribute(key);
      option.disabled = offered.get(option) || Boolean(reason);
      option.textContent = option.dataset.label + (reason ? " · " + reason : offered.get(option) ? " · not offered here" : "");
      if (reason && option.selected) refusedChosen = reason;
    }
    note.hidden = !refusedChosen;
    note.textContent = refusedChosen ? template + " cannot run on " + gpu.value + ": " + refusedChosen : "";
  }

  templates.addEventListener("change", update);
  gpu.addEventListener("change", update);
  update();
})();
