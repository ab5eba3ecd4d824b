// The mesh builder: a mesh of any axes built from the axis list, refused at the axis the model
// cannot split with the fix, trained, drawn as a grid of devices by their coordinates, and
// reopened from its link; hostile meshes in a link refused at the mesh.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { close, formValues, hashOf, launch, openReady, setControl, singleSteps } from './helpers.js';

before(launch);
after(close);

const fieldError = (page, field) => page.locator(`[data-testid="field-error"][data-field="${field}"]`);

test('a three-axis mesh built from the axis list trains, draws its devices and reopens from its link', { timeout: 400_000 }, async () => {
  const { context, page, consoleErrors } = await openReady(hashOf({ mode: 'shard_map' }));
  try {
    for (const axis of ['tp', 'pp']) {
      await page.getByTestId('mesh-add').selectOption(axis);
      await page.waitForFunction((a) => window.shardlab.settings && window.shardlab.settings.mesh.includes(`${a}=2`), axis, { timeout: 60_000 });
    }
    assert.equal(await page.getByTestId('mesh').inputValue(), 'dp=2,tp=2,pp=2');
    // One block over pp=2: refused at the pp axis's size, naming the layers and the fix.
    const pp = fieldError(page, 'mesh.pp');
    await pp.waitFor({ timeout: 60_000 });
    assert.match(await pp.textContent(), /more stages than layers 1.*pp = one of 1/);
    assert.equal(await page.getByTestId('play').isDisabled(), true);
    await setControl(page, 'layers', '2');
    await page.waitForFunction(() => window.shardlab.configured && window.shardlab.settings.layers === 2, null, { timeout: 120_000 });
    assert.equal(await page.locator('[data-testid="field-error"]').count(), 0);
    // Eight devices, each labelled by its coordinates.
    const cells = page.getByTestId('mesh-cell');
    assert.equal(await cells.count(), 8);
    assert.equal(await cells.nth(5).getAttribute('title'), 'device 5: dp=1, tp=0, pp=1');
    assert.equal(await singleSteps(page, 1), 1);
    // Sequence parallelism shows with tp, ZeRO with dp; removing dp hides ZeRO.
    assert.equal(await page.locator('#sp-field').isVisible(), true);
    assert.equal(await page.locator('#zero-field').isVisible(), true);
    const hash = new URL(page.url()).hash;
    assert.match(hash, /mesh=dp%3D2%2Ctp%3D2%2Cpp%3D2/);
    const shown = await formValues(page);
    const again = await openReady(hash);
    try {
      assert.deepEqual(await formValues(again.page), shown);
      assert.equal(await again.page.getByTestId('mesh-cell').count(), 8);
    } finally {
      await again.context.close();
    }
    await page.getByTestId('mesh-remove-dp').click();
    await page.waitForFunction(() => window.shardlab.settings.mesh === 'tp=2,pp=2', null, { timeout: 60_000 });
    assert.equal(await page.locator('#zero-field').isVisible(), false);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await context.close();
  }
});

test('an axis the model cannot split is refused at its size, and hostile meshes in a link at the mesh', { timeout: 300_000 }, async () => {
  // tp=3 over 2 heads: at the tp size control, naming both fixes.
  const tp = await openReady(hashOf({ mode: 'shard_map', mesh: 'dp=2,tp=3' }));
  try {
    const e = fieldError(tp.page, 'mesh.tp');
    await e.waitFor({ timeout: 60_000 });
    assert.match(await e.textContent(), /tp=3 does not divide heads 2.*tp = one of 1, 2/);
    assert.doesNotMatch(await e.textContent(), /--/);
  } finally {
    await tp.context.close();
  }
  for (const [mesh, words] of [
    ['dp=2,dp=2', /given twice/],
    ['xx=2', /names no parallelism/],
    ['dp=0', /size 0/],
    ['dp=2147483648', /more than 16384 devices/],
    ['dp=128', /the page simulates at most 64/],
  ]) {
    const { context, page } = await openReady(hashOf({ mesh }));
    try {
      const e = fieldError(page, 'mesh');
      await e.waitFor({ timeout: 60_000 });
      assert.match(await e.textContent(), words, mesh);
      assert.equal(await page.getByTestId('play').isDisabled(), true, mesh);
    } finally {
      await context.close();
    }
  }
});

test('an fsdp link from before fsdp was an axis reopens on an fsdp axis, and the builder fits 390 px', { timeout: 120_000 }, async () => {
  const { context, page } = await openReady(hashOf({ preset: 'fsdp', mesh: 'dp=2' }), { viewport: { width: 390, height: 844 } });
  try {
    assert.equal(await page.getByTestId('mesh').inputValue(), 'fsdp=2');
    const overflow = await page.evaluate(() => {
      const b = document.querySelector('[data-testid="mesh-builder"]').getBoundingClientRect();
      return b.right - document.documentElement.clientWidth;
    });
    assert.ok(overflow <= 0, `the mesh builder overflows by ${overflow} px`);
  } finally {
    await context.close();
  }
});
