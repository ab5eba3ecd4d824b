// "this GPU" in the modelled chart's device picker: the cost model's `this` profile, calibrated
// here by the core's microbenchmarks (a few seconds) the first time it is picked, then cached
// per adapter in localStorage so a reload does not measure again; a button measures again.
// The predictions it feeds are modelled, like every other device kind's.

// v2: the matmul packs load vec4s, so a v1 calibration overprices matmuls and is measured again.
const KEY_PREFIX = 'shardlab.this-gpu.v2:';

/** The localStorage key of one adapter's calibration. */
function cacheKey(adapter) {
  return KEY_PREFIX + [adapter.name, adapter.backend, adapter.driver, adapter.device_type].join('|');
}

/**
 * Adds "this GPU" to the device kinds (`presets.devices`, before the picker is filled) and
 * installs this adapter's cached calibration if there is one. Call `wire` once the picker exists.
 * `status` is told what happens (`'cached'`, `'measuring'`, `'measured'`, `'failed'`).
 */
export function setupThisGpu({ wasm, lab, adapter, presets, el, status = () => {} }) {
  const key = cacheKey(adapter);
  let calibrated = false;
  let label = 'this GPU (calibrate here)';
  const report = (what, detail) => {
    document.body.dataset.thisGpu = what;
    status(what, detail);
  };
  try {
    const cached = localStorage.getItem(key);
    if (cached) {
      const r = JSON.parse(wasm.Shardlab.install_calibration(cached));
      if (r.ok) {
        calibrated = true;
        label = `${r.label} (calibrated)`;
        report('cached');
      } else {
        localStorage.removeItem(key);
      }
    }
  } catch {
    // No localStorage (private mode, blocked storage): calibrate on every visit.
  }
  presets.devices.unshift({ name: 'this', label });

  async function calibrate() {
    report('measuring');
    const r = JSON.parse(await lab.calibrate());
    if (!r.ok) {
      report('failed', r.error);
      return false;
    }
    calibrated = true;
    try {
      localStorage.setItem(key, JSON.stringify(r.calibration));
    } catch {
      // A cache that cannot be written only costs a calibration next visit.
    }
    report('measured', r.calibration);
    return true;
  }

  /** Hooks the picker: picking "this GPU" before it is calibrated measures first. */
  function wire(select, anchor) {
    const note = el('span', { class: 'muted small', 'data-testid': 'this-gpu-status' });
    const again = el('button', { type: 'button', 'data-testid': 'recalibrate', title: 'Run the microbenchmarks of this GPU again' }, 'recalibrate');
    const box = el('span', { class: 'this-gpu' }, again, ' ', note);
    anchor.after(box);
    const show = () => {
      box.hidden = select.value !== 'this';
    };
    status = ((inner) => (what, detail) => {
      note.textContent = {
        cached: 'calibrated earlier on this adapter (cached)',
        measuring: 'calibrating this GPU (microbenchmarks, a few seconds)…',
        measured: `calibrated in ${detail?.seconds?.toFixed?.(1) ?? '?'} s`,
        failed: String(detail),
      }[what] ?? '';
      inner(what, detail);
    })(status);
    if (document.body.dataset.thisGpu === 'cached') status('cached');
    const reconfigure = () => select.dispatchEvent(new Event('change', { bubbles: true }));
    const setLabel = () => {
      const opt = [...select.options].find((o) => o.value === 'this');
      if (opt && calibrated) opt.textContent = opt.textContent.replace(' (calibrate here)', ' (calibrated)');
    };
    // On the select itself, so it runs before the form's change handler, which it holds back
    // until the profile exists.
    select.addEventListener('change', (e) => {
      show();
      if (select.value !== 'this' || calibrated) return;
      e.stopPropagation();
      select.disabled = again.disabled = true;
      calibrate().then((ok) => {
        select.disabled = again.disabled = false;
        setLabel();
        if (ok) reconfigure();
      });
    });
    again.addEventListener('click', () => {
      select.disabled = again.disabled = true;
      calibrate().then((ok) => {
        select.disabled = again.disabled = false;
        if (ok && select.value === 'this') reconfigure();
      });
    });
    window.addEventListener('shardlab:prediction', show);
    // Controls written by the page (a link, a preset) fire no change event.
    window.addEventListener('shardlab:controls', show);
    show();
  }

  return { wire, calibrate, isCalibrated: () => calibrated };
}
