import { h, clear } from "./dom.js";

let open = false;

// isOpen tells the refresh loop to leave the page alone.
export function isOpen() { return open; }

// actionDialog asks for confirmation (and optional fields) and runs
// action(values). An error from action is shown in the dialog, which stays
// open; success closes it. Resolves to action's result, or null when
// dismissed.
export function actionDialog({ title, message, confirm = "Confirm", danger = false, fields = [], action }) {
  const root = document.getElementById("dialog-root");
  return new Promise((resolve) => {
    const inputs = {};
    const error = h("div", { class: "error", hidden: true });
    const close = (result) => {
      open = false;
      clear(root);
      document.removeEventListener("keydown", onKey);
      resolve(result);
    };
    const submit = async () => {
      const values = {};
      for (const [k, el] of Object.entries(inputs)) values[k] = el.value.trim();
      ok.disabled = true;
      error.hidden = true;
      try {
        close(await action(values));
      } catch (e) {
        error.textContent = e.message;
        error.hidden = false;
        ok.disabled = false;
      }
    };
    const onKey = (e) => {
      if (e.key === "Escape") close(null);
      if (e.key === "Enter" && e.target.tagName === "INPUT") submit();
    };
    const ok = h("button", { class: danger ? "danger solid" : "primary", "data-test": "dialog-confirm", onclick: submit, text: confirm });
    const body = fields.map((f) => {
      const input = h("input", { name: f.name, type: f.type || "text", placeholder: f.placeholder || "", value: f.value || "" });
      inputs[f.name] = input;
      return h("label", {}, f.label, input);
    });
    const dlg = h("div", { class: "dialog", role: "dialog", "aria-modal": "true", "aria-label": title },
      h("h3", { text: title }),
      message ? h("p", { text: message }) : null,
      body,
      error,
      h("div", { class: "actions" },
        h("button", { onclick: () => close(null), text: "Back" }),
        ok));
    const backdrop = h("div", { class: "backdrop", onclick: (e) => { if (e.target === backdrop) close(null); } }, dlg);
    clear(root).appendChild(backdrop);
    open = true;
    document.addEventListener("keydown", onKey);
    (body.length ? inputs[fields[0].name] : ok).focus();
  });
}

let toastTimer;

export function toast(text, isError = false) {
  document.querySelector(".toast")?.remove();
  const el = h("div", { class: isError ? "toast error" : "toast", role: "status", text });
  document.body.appendChild(el);
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.remove(), 4000);
}
